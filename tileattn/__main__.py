"""Command line: python -m tileattn {demo, bench, accuracy, info, plot}.

Every command that runs kernels says where they ran: compiled on the GPU, in Triton's CPU
interpreter (with tileattn's corrections of its arithmetic, or without them under an unverified
Triton), or nowhere (a CPU without TRITON_INTERPRET=1, where attention() refuses CPU tensors).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time


def execution_path() -> tuple[str, str]:
    """(kind, words): where tileattn's kernels run in this process. kind is "gpu" (compiled
    for the GPU), "interpreter" (Triton's CPU interpreter) or "none". The interpreter is decided
    when tileattn's kernels are defined (TRITON_INTERPRET=1 at import), so it is asked first:
    it wins over a GPU."""
    import torch
    import triton

    from tileattn.interpreter_fixes import TRITON_VERSION
    from tileattn.kernels.runtime import interpreter_active

    if interpreter_active():
        if triton.__version__ == TRITON_VERSION:
            return "interpreter", ("the Triton kernels in Triton's CPU interpreter, with "
                                   "tileattn's corrections of its FP8/bf16 arithmetic (verified "
                                   f"for triton {TRITON_VERSION})")
        return "interpreter", ("the Triton kernels in Triton's CPU interpreter, uncorrected: "
                               f"tileattn's corrections are verified for triton {TRITON_VERSION}, "
                               f"not {triton.__version__}, so bf16 and FP8 results may be wrong")
    if torch.cuda.is_available():
        return "gpu", f"the compiled kernels on the GPU ({torch.cuda.get_device_name()})"
    return "none", ("nowhere: no CUDA GPU is visible and TRITON_INTERPRET=1 was not set before "
                    "tileattn was imported, so attention() refuses CPU tensors")


def cpu_hint(command: str) -> str:
    return (f"To run tileattn's kernels on this CPU, in Triton's interpreter (slow, small "
            f"shapes): TRITON_INTERPRET=1 python -m tileattn {command}")


def _corrections_verified() -> bool:
    import triton

    from tileattn.interpreter_fixes import TRITON_VERSION
    return triton.__version__ == TRITON_VERSION


def _demo(args) -> None:
    import torch

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        # No GPU: run the very same Triton kernels on the CPU through the interpreter. It must be
        # switched on before the kernels are defined, so the demo re-executes itself once.
        os.execve(sys.executable, [sys.executable, "-m", "tileattn", *sys.argv[1:]],
                  {**os.environ, "TRITON_INTERPRET": "1"})
    import tileattn
    from tileattn.reference import attention_reference

    kind, path = execution_path()
    on_gpu = kind == "gpu"
    device = "cuda" if on_gpu else "cpu"
    batch, seqlen, heads, kv_heads, head_dim = (4, 4096, 32, 8, 128) if on_gpu else (1, 200, 4, 2, 64)
    print(f"tileattn demo: {path}")
    print(f"B={batch} N={seqlen} Hq={heads} Hkv={kv_heads} D={head_dim}, causal")
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(batch, seqlen, heads, head_dim, device=device, generator=gen)
    k = torch.randn(batch, seqlen, kv_heads, head_dim, device=device, generator=gen)
    v = torch.randn(batch, seqlen, kv_heads, head_dim, device=device, generator=gen)
    dtypes = [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2]
    if not on_gpu and not _corrections_verified():
        dtypes.remove(torch.bfloat16)  # an uncorrected interpreter multiplies bf16's raw bits
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

    import tileattn
    from tileattn import dispatch
    from tileattn.arch import arch_of, v_needs_k_major
    from tileattn.kernels.attention import fwd
    from tileattn.kernels.mla import decode as mla_decode

    print(f"tileattn {tileattn.__version__}, torch {torch.__version__}, triton {triton.__version__}")
    kind, path = execution_path()
    on_gpu = kind == "gpu"
    device = torch.device("cuda" if on_gpu else "cpu")
    if on_gpu:
        props = torch.cuda.get_device_properties(device)
        print(f"device: {props.name}, capability {props.major}.{props.minor}, "
              f"{props.multi_processor_count} SMs")
    else:
        print("device: CPU")
    print(f"kernels run: {path}")
    if kind == "none":
        print(cpu_hint("info"))
        print("No kernel can run here, so no kernel choice or tile config applies.")
        return
    settings = dispatch.current()
    print(f"kernel settings: attention={settings.attention}, mla={settings.mla} "
          "(TILEATTN_KERNEL / TILEATTN_MLA_KERNEL at import; tileattn.use_kernels overrides)")
    arch = arch_of(device)
    print(f"arch row: {arch}")
    if not on_gpu:
        print("tile configs: the interpreter's small tiles, so that short test sequences span "
              "several blocks")
    print("forward attention:")
    if arch.has_wgmma:
        from tileattn.kernels.attention import sm90
        print(f"  Hopper Gluon kernel for fp16/bf16 with batch*heads*Sq*Sk*D >= "
              f"2^{dispatch.SM90_MIN_WORK.bit_length() - 1} (head dim 64: "
              f"2^{dispatch.SM90_MIN_WORK_D64.bit_length() - 1}; halved when "
              f"causal) where TMA can address the strides; configs by padded head dim: "
              f"{ {d: sm90.CONFIGS[d] for d in (64, 128, 256)} }; from "
              f"{sm90.LONG_QUERIES} queries (dense): {sm90.LONG_QUERY_CONFIGS}; fewer "
              f"(dense): {sm90.SHORT_QUERY_CONFIGS}")
        print("  portable Triton kernel otherwise:")
    for dtype in (torch.bfloat16, torch.float8_e4m3fn):
        if dtype.itemsize == 1 and not arch.has_fp8_mma:
            continue
        print(f"  {str(dtype).replace('torch.', '')}: V made K-major in the call: "
              f"{v_needs_k_major(arch, dtype)}")
        for head_dim in (64, 128, 256):
            config = fwd.config_for(arch, head_dim, head_dim, dtype.itemsize == 1)
            causal_config = fwd.config_for(arch, head_dim, head_dim, dtype.itemsize == 1,
                                           causal=True)
            extra = f", causal {causal_config}" if causal_config != config else ""
            print(f"    D={head_dim}: {config}{extra}")
    print("attention backward (dK/dV pass, then a fixed-order dQ pass):")
    from tileattn.kernels.attention import bwd
    hopper = dispatch.backward_kernel(arch, settings) == "sm90"
    if hopper:
        from tileattn.kernels.attention import sm90_bwd
        print("  Gluon rows (sm90_bwd.py) serve dense calls without windows or score hooks; the "
              "portable kernels the rest")
    for head_dim in (64, 128, 256):
        passes = []
        for name, table, portable in (("dK/dV", "DKDV_CONFIGS", bwd.dkdv_config),
                                      ("dQ", "DQ_CONFIGS", bwd.dq_config)):
            row = getattr(sm90_bwd, table).get(head_dim) if hopper else None
            passes.append(f"{name} Gluon {row}" if row else
                          f"{name} portable {portable(arch, head_dim, head_dim)}")
        print(f"  D={head_dim}: " + ", ".join(passes))
    print("MLA decode (per H*q_len rows a sequence):")
    for rows in (16, 128):
        config = mla_decode.config_for(arch, None, rows)
        kernel = dispatch.mla_kernel(arch, rows, 64, torch.bfloat16, config.schedule, settings)
        print(f"  {rows} rows, pages of 64: {kernel} partial kernel, {config}")


def _bench(args) -> None:
    import torch

    if args.merge:
        if args.mla:
            sys.exit("python -m tileattn bench --merge merges parts of the prefill grid, not --mla")
        from tileattn.bench import prefill, runs
        path = runs.merge(args.merge, prefill.grid_points(), prefill.POINT_FIELDS, args.out)
        print(f"wrote {path}")
        return
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
        kwargs = {"budget_s": args.budget_s}
        if args.head_dims:
            kwargs["head_dims"] = tuple(args.head_dims)
        if args.contexts:
            kwargs["contexts"] = tuple(args.contexts)
        if args.peers:
            kwargs["peers"] = tuple(args.peers)
        prefill.run(out_dir=args.out, quick=args.quick, **kwargs)


def _accuracy(args) -> None:
    kind, path = execution_path()
    if kind == "none":
        sys.exit(f"python -m tileattn accuracy: the kernels can run {path}.\n"
                 f"{cpu_hint('accuracy')}")
    from tileattn.bench import accuracy
    from tileattn.bench.common import device_facts, write_results

    on_gpu = kind == "gpu"
    print(f"accuracy of {path}")
    head_dims = tuple(args.head_dims or accuracy.HEAD_DIMS)
    rows = accuracy.run(device="cuda" if on_gpu else "cpu", head_dims=head_dims)
    print(accuracy.format_table(rows))
    if on_gpu:
        complete = head_dims == accuracy.HEAD_DIMS
        written = write_results("accuracy", {**device_facts(), "rows": rows}, args.out, complete)
        print(f"results: {written}")
    else:
        print("(small shapes in the interpreter: no results file is written)")


def _plot(args) -> None:
    from tileattn.bench import accuracy, common, mla, prefill, runs

    if args.results:
        groups = [[pathlib.Path(p) for p in args.results]]
    else:
        root = common.default_results_dir()
        groups = [[path] for path in sorted(root.glob("*/*.json"))]
        if not groups:
            sys.exit(f"no results files under {root}: run `python -m tileattn bench` on a GPU "
                     "first, or name the files")
    for paths in groups:
        payloads = [common.load_results(path) for path in paths]
        grids = {payload["grid"] for payload in payloads}
        if len(grids) > 1:
            sys.exit(f"python -m tileattn plot: the files hold different grids {sorted(grids)}")
        grid = grids.pop()
        print(f"== {', '.join(map(str, paths))}: {grid}, {payloads[-1]['device']}, "
              f"{payloads[-1]['date']}")
        if grid == "prefill":
            payload = runs.merged_payload(payloads, prefill.POINT_FIELDS)
            if args.markdown:
                print(prefill.format_markdown(payload))
                continue
            print(prefill.format_tables(payload))
            prefill.plot(payload, paths[-1].with_suffix(".png"))
        elif grid == "mla":
            for payload in payloads:
                print(mla.format_table(payload["rows"], payload["copy_gbps"]))
        elif grid == "accuracy":
            for payload in payloads:
                print(accuracy.format_table(payload["rows"]))
        else:
            print(f"(no table for the {grid} grid yet)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tileattn", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="run a realistic forward and print its error (and speed on "
                                     "GPU); on a CPU, in Triton's interpreter")
    results_help = ("results folder (default: benchmarks/results in a source checkout, else "
                    "./tileattn-results); files go to <folder>/<gpu>/<grid>.json")
    bench = commands.add_parser("bench", help="the benchmark grid with peers (GPU)")
    bench.add_argument("--mla", action="store_true", help="the MLA decode grid instead of prefill")
    bench.add_argument("--quick", action="store_true", help="a few points only")
    bench.add_argument("--out", default=None, help=results_help)
    bench.add_argument("--head-dims", type=int, nargs="+", help="a subset of the grid's head dims")
    bench.add_argument("--contexts", type=int, nargs="+", help="a subset of the grid's contexts")
    bench.add_argument("--peers", nargs="+", choices=("cudnn", "fa2", "flex", "fa4"),
                       help="a subset of the peers (default all that can run: cudnn, fa2, "
                            "flex, fa4)")
    bench.add_argument("--budget-s", type=float, default=None,
                       help="prefill: start no new point after this many seconds")
    bench.add_argument("--merge", nargs="+", metavar="JSON",
                       help="prefill: merge partial runs by point into prefill.json (no GPU)")
    accuracy = commands.add_parser("accuracy", help="error table per dtype vs fp64")
    accuracy.add_argument("--out", default=None, help=results_help)
    accuracy.add_argument("--head-dims", type=int, nargs="+", help="a subset of 64 128 256")
    commands.add_parser("info", help="where kernels run, device, arch row, kernel choice, configs")
    plot = commands.add_parser("plot", help="tables (and the prefill PNG) from results files")
    plot.add_argument("results", nargs="*",
                      help="results files of one grid (default: every file in the results "
                           "folder, one by one); a later prefill file's points replace an "
                           "earlier one's")
    plot.add_argument("--markdown", action="store_true", help="print the README's prefill table")
    args = parser.parse_args(argv)
    {"demo": _demo, "bench": _bench, "accuracy": _accuracy, "info": _info, "plot": _plot}[args.command](args)


if __name__ == "__main__":
    main()
