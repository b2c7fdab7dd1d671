"""Accuracy of FP8 scale choices (tileattn.quantize_qkv_fp8: per tensor, per head, per block,
K smoothing, Hadamard rotation) on plain, outlier and attention-sink inputs, against fp64
attention of the unquantized inputs. What is measured and how: tileattn/bench/fp8_scales.py.

    CPU (quantization in torch ops, attention emulated in fp64; ~10 s):
        PYTHONPATH=$PWD python benchmarks/fp8_scales_accuracy.py
    CPU, quantization and the kernel column in the Triton interpreter (minutes):
        PYTHONPATH=$PWD python benchmarks/fp8_scales_accuracy.py --interpret
    GPU (Triton quantization kernels, the kernel column from attention()):
        PYTHONPATH=$PWD python benchmarks/fp8_scales_accuracy.py --device cuda \
            --batch 2 --seqlen 4096 --heads 8 --seeds 0 1 2 --out benchmarks/results
"""

import argparse
import datetime
import json
import os
import pathlib
import sys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seqlen", type=int, default=256)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--interpret", action="store_true",
                        help="run the Triton kernels on the CPU (TRITON_INTERPRET=1)")
    parser.add_argument("--out", default=None, help="folder for the results JSON")
    args = parser.parse_args()
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"   # before triton is imported

    import torch

    from tileattn import interpreter_fixes
    from tileattn.bench import fp8_scales
    if args.interpret:
        interpreter_fixes.apply()
    rows = fp8_scales.run(batch=args.batch, seqlen=args.seqlen, heads=args.heads,
                          head_dim=args.head_dim, seeds=tuple(args.seeds), device=args.device)
    print(f"causal, B={args.batch} N={args.seqlen} H={args.heads} D={args.head_dim}, "
          f"seeds {args.seeds}, e4m3; relative L2 error vs fp64 on the unquantized inputs")
    print(fp8_scales.format_table(rows))
    if args.out:
        device = (torch.cuda.get_device_name() if args.device.startswith("cuda")
                  else "cpu-interpreter" if args.interpret else "cpu")
        payload = {"device": device, "torch": torch.__version__,
                   "date": datetime.date.today().isoformat(), "argv": sys.argv[1:], "rows": rows}
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{payload['date']}-{device.split()[-1].lower()}-fp8-scales-accuracy.json"
        path.write_text(json.dumps(payload, indent=1) + "\n")
        print(f"results: {path}")


if __name__ == "__main__":
    main()
