"""Command line: python -m tileattn {demo, bench, accuracy, info, plot}."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _demo(args) -> None:
    import torch

    if not torch.cuda.is_available():
        # No GPU: run the very same Triton kernel on the CPU through the interpreter. It must be
        # switched on before the kernels are defined, so the demo re-executes itself once.
        if os.environ.get("TRITON_INTERPRET") != "1":
            os.environ["TRITON_INTERPRET"] = "1"
            os.execv(sys.executable, [sys.executable, "-m", "tileattn", *sys.argv[1:]])
    import tileattn
    from tileattn import interpreter_fixes
    from tileattn.reference import attention_reference

    on_gpu = torch.cuda.is_available()
    # Triton 3.6's interpreter rounds FP8/bf16 unlike the GPU and cannot multiply bf16.
    interpreter_fixed = not on_gpu and interpreter_fixes.apply()
    device = "cuda" if on_gpu else "cpu"
    batch, seqlen, heads, kv_heads, head_dim = (4, 4096, 32, 8, 128) if on_gpu else (1, 200, 4, 2, 64)
    print(f"tileattn demo on {torch.cuda.get_device_name() if on_gpu else 'CPU (Triton interpreter)'}: "
          f"B={batch} N={seqlen} Hq={heads} Hkv={kv_heads} D={head_dim}, causal")
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(batch, seqlen, heads, head_dim, device=device, generator=gen)
    k = torch.randn(batch, seqlen, kv_heads, head_dim, device=device, generator=gen)
    v = torch.randn(batch, seqlen, kv_heads, head_dim, device=device, generator=gen)
    dtypes = [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2]
    if not on_gpu and not interpreter_fixed:
        dtypes.remove(torch.bfloat16)  # an uncorrected interpreter multiplies bf16 bits
    ref_batch = slice(0, 1)  # the fp64 reference on one batch element keeps the demo quick
    for dtype in dtypes:
        if dtype.itemsize == 1:
            (q_, qd), (k_, kd), (v_, vd) = (tileattn.quantize_fp8(x, dtype, per="head") for x in (q, k, v))
            descales = dict(q_descale=qd, k_descale=kd, v_descale=vd)
        else:
            q_, k_, v_ = (x.to(dtype) for x in (q, k, v))
            descales = {}
        start = time.time()
        out = tileattn.attention(q_, k_, v_, causal=True, **descales)
        elapsed = time.time() - start
        sliced = {name: (d[ref_batch] if d.dim() else d) for name, d in descales.items()}
        ref, _ = attention_reference(q_[ref_batch], k_[ref_batch], v_[ref_batch], causal=True, **sliced)
        exact, _ = attention_reference(q[ref_batch], k[ref_batch], v[ref_batch], causal=True)
        error = float((out[ref_batch].double() - ref).norm() / ref.norm())
        error_exact = float((out[ref_batch].double() - exact).norm() / exact.norm())
        line = (f"  {str(dtype).replace('torch.', ''):<15} rel. error vs fp64: {error:.2e} "
                f"(vs unquantized inputs {error_exact:.2e})")
        if on_gpu:
            from tileattn.bench.common import time_ms
            ms = time_ms(lambda: tileattn.attention(q_, k_, v_, causal=True, **descales))
            tflops = 2 * batch * heads * seqlen * seqlen * head_dim / ms / 1e9
            line += f"  {ms:.3f} ms  {tflops:.0f} TFLOP/s"
        else:
            line += f"  ({elapsed:.1f} s in the interpreter)"
        print(line)


def _info(args) -> None:
    import torch
    import triton

    from tileattn.arch import arch_of, v_needs_k_major
    from tileattn.kernels.attention import fwd as attention_fwd
    from tileattn.kernels.runtime import interpreter_active

    print(f"torch {torch.__version__}, triton {triton.__version__}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    arch = arch_of(device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        print(f"device: {props.name}, capability {props.major}.{props.minor}, "
              f"{props.multi_processor_count} SMs")
    else:
        print(f"device: CPU ({'Triton interpreter' if interpreter_active() else 'fp64 reference path; set TRITON_INTERPRET=1 to run the kernel'})")
    print(f"arch row: {arch}")
    if arch.has_wgmma:
        from tileattn.kernels.attention import sm90 as attention_sm90
        print("  fp16/bf16, non-causal, D 128/256, >= 4096 keys: Hopper Gluon kernel "
              f"{ {d: attention_sm90.CONFIGS[d] for d in (128, 256)} } "
              f"(TILEATTN_KERNEL={os.environ.get('TILEATTN_KERNEL', 'auto')})")
    for dtype in (torch.bfloat16, torch.float8_e4m3fn):
        print(f"  {dtype}: V made K-major: {v_needs_k_major(arch, dtype)}")
        for head_dim in (64, 128, 256):
            if dtype.itemsize == 1 and not arch.has_fp8_mma:
                continue
            config = attention_fwd.config_for(arch, head_dim, head_dim, dtype.itemsize == 1)
            causal_config = attention_fwd.config_for(arch, head_dim, head_dim,
                                                     dtype.itemsize == 1, causal=True)
            extra = f", causal {causal_config}" if causal_config != config else ""
            print(f"    D={head_dim}: portable kernel {config}{extra}")


def _bench(args) -> None:
    import torch

    if not torch.cuda.is_available():
        # Timings of the interpreter mean nothing, and the peers (cuDNN, FlashAttention) need a GPU.
        sys.exit("python -m tileattn bench needs a CUDA GPU (none is visible to torch "
                 f"{torch.__version__}); on a CPU, `python -m tileattn demo` runs the kernels "
                 "in Triton's interpreter")
    if args.mla:
        from tileattn.bench import mla
        mla.run(out_dir=args.out, quick=args.quick)
    else:
        from tileattn.bench import prefill
        kwargs = {}
        if args.head_dims:
            kwargs["head_dims"] = tuple(args.head_dims)
        if args.contexts:
            kwargs["contexts"] = tuple(args.contexts)
        prefill.run(out_dir=args.out, quick=args.quick, **kwargs)


def _accuracy(args) -> None:
    import torch

    from tileattn.bench import accuracy
    from tileattn.bench.common import device_facts, write_results
    rows = accuracy.run()
    print(accuracy.format_table(rows))
    if torch.cuda.is_available():
        path = write_results("accuracy", {**device_facts(), "rows": rows}, args.out)
        print(f"results: {path}")


def _plot(args) -> None:
    from tileattn.bench import prefill
    payloads = []
    for path in args.results:
        with open(path) as f:
            payloads.append(json.load(f))
    payload = prefill.merge_by_head_dim(payloads)
    if args.markdown:
        print(prefill.format_markdown(payload))
        return
    print(prefill.format_tables(payload))
    prefill.plot(payload, args.results[-1].replace(".json", ".png"))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tileattn", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="run a realistic forward and print its error (and speed on GPU)")
    bench = commands.add_parser("bench", help="the benchmark grid with peers (GPU)")
    bench.add_argument("--mla", action="store_true", help="the MLA decode grid instead of prefill")
    bench.add_argument("--quick", action="store_true", help="a few points only")
    bench.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    bench.add_argument("--head-dims", type=int, nargs="+", help="a subset of the grid's head dims")
    bench.add_argument("--contexts", type=int, nargs="+", help="a subset of the grid's contexts")
    accuracy = commands.add_parser("accuracy", help="error table per dtype vs fp64")
    accuracy.add_argument("--out", default=None)
    commands.add_parser("info", help="device, arch row, kernel configs, V-layout decision")
    plot = commands.add_parser("plot", help="tables and PNG from prefill results JSON files")
    plot.add_argument("results", nargs="+",
                      help="results files; a later file's head dims replace an earlier file's")
    plot.add_argument("--markdown", action="store_true", help="print the README's table instead")
    args = parser.parse_args(argv)
    {"demo": _demo, "bench": _bench, "accuracy": _accuracy, "info": _info, "plot": _plot}[args.command](args)


if __name__ == "__main__":
    main()
