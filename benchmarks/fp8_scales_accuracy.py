"""The FP8 scales rows of the accuracy grid alone: benchmarks/fp8_scales_accuracy.py measures
tileattn.quantize_qkv_fp8's scale choices (per tensor, per head, per block, K smoothing,
Hadamard rotation) on plain, outlier, key-offset and attention-sink inputs against fp64
attention of the unquantized inputs (tileattn/bench/fp8_scales.py says how). The whole accuracy
grid, these rows included, is `python -m tileattn accuracy`.

    GPU (Triton quantization kernels, the kernel column from attention(); ~1.5 min on an H100;
    writes <gpu>/accuracy-partial.json under --out, default benchmarks/results in a checkout):
        python benchmarks/fp8_scales_accuracy.py --device cuda            # fp8_scales.GPU_SHAPE
        python benchmarks/fp8_scales_accuracy.py --device cuda --quick    # seed 0 only
    CPU (quantization in torch ops, attention emulated in fp64; seconds; evidence JSON
    fp8-scales-accuracy-cpu.json under --out, default $OUT, else .):
        PYTHONPATH=$PWD python benchmarks/fp8_scales_accuracy.py --seeds 0 1 2
    CPU with the quantization and the kernel column in Triton's interpreter (minutes):
        TRITON_INTERPRET=1 PYTHONPATH=$PWD python benchmarks/fp8_scales_accuracy.py
"""

from __future__ import annotations

import argparse


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/fp8_scales_accuracy.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--batch", type=int)
    parser.add_argument("--seqlen", type=int)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--head-dim", type=int)
    parser.add_argument("--seeds", type=int, nargs="+")
    parser.add_argument("--quick", action="store_true", help="seed 0 only")
    parser.add_argument("--out", default=None, help="folder for the results (see above)")
    args = parser.parse_args(argv)

    import torch

    from tileattn import interpreter_fixes
    from tileattn.bench import fp8_scales
    from tileattn.bench.common import device_facts, write_json, write_results
    from tileattn.kernels.runtime import interpreter_active
    on_gpu = args.device == "cuda"
    if on_gpu and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA GPU is visible")
    interpreted = interpreter_active()
    if interpreted:   # TRITON_INTERPRET=1 was set before tileattn was imported
        interpreter_fixes.apply()
    shape = dict(fp8_scales.GPU_SHAPE) if on_gpu else dict(batch=1, seqlen=256, heads=2,
                                                           head_dim=128, seeds=(0,))
    for name in ("batch", "seqlen", "heads", "head_dim", "seeds"):
        if getattr(args, name) is not None:
            shape[name] = tuple(args.seeds) if name == "seeds" else getattr(args, name)
    if args.quick:
        shape["seeds"] = (0,)
    rows = fp8_scales.run(device=args.device, **shape)
    print(f"causal, B={shape['batch']} N={shape['seqlen']} H={shape['heads']} "
          f"D={shape['head_dim']}, seeds {list(shape['seeds'])}, e4m3; relative L2 error vs "
          f"fp64 on the unquantized inputs")
    print(fp8_scales.format_table(rows))
    if on_gpu:   # part of the accuracy grid: never its canonical file
        path = write_results("accuracy", {**device_facts(), "rows": rows}, args.out,
                             complete=False)
    else:
        import datetime
        facts = {"device": "cpu-interpreter" if interpreted else "cpu",
                 "torch": torch.__version__, "date": datetime.date.today().isoformat(),
                 "shape": {k: list(v) if k == "seeds" else v for k, v in shape.items()}}
        path = write_json("fp8-scales-accuracy-" + facts["device"], {**facts, "rows": rows},
                          args.out)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
