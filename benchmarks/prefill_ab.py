"""A/B of the forward kernels through attention(), as a user's call sees them.

Each kernel setting runs under `tileattn.use_kernels(attention=...)` on the same inputs; outputs
are compared with the first setting's and every time is a do_bench median of the eager call, so
the host path (checks, call cache, V transposition, launch) is inside it (--graph: CUDA-graph
replays instead, the kernels alone). Before it is timed, each output's first batch element is
checked against the fp64 reference (tileattn/reference.py). A forced kernel that does not support the inputs falls
back to the portable one; the `ran` field says which kernel ran. This decides
`tileattn/dispatch.py`'s forward rule (docs/design.md, "Kernel choice").

    python benchmarks/prefill_ab.py [--kernels portable,sm90] [--graph] [--out DIR]
        [--batch 4] [--heads 32] [D:Dv:N:causal:dtype ...]

A point is head dims D and Dv, context N (queries = keys), causal 0/1 and a dtype (bf16, fp16,
fp8e4m3, fp8e5m2; FP8 quantized per tensor, V row-major so its transposition is timed). The
default points are the dispatch threshold's neighbourhood and the padded head dims.
Output: prefill-ab.json under --out ($OUT, else the current directory).
"""

from __future__ import annotations

import argparse

import torch
import triton

import tileattn
from tileattn import dispatch
from tileattn.arch import arch_of
from tileattn.bench.common import device_facts, spin_up, time_ms, write_json
from tileattn.bench.prefill import CHECK_TOLERANCE, TILEATTN_DTYPES
from tileattn.reference import attention_reference

POINTS = ["128:128:1024:0:bf16", "128:128:1024:1:bf16", "128:128:2048:0:bf16",
          "128:128:2048:1:bf16", "256:256:1024:1:bf16", "64:64:16384:0:bf16",
          "192:128:8192:0:bf16", "192:128:8192:1:bf16", "96:96:8192:0:bf16",
          "192:192:8192:1:bf16", "128:128:16384:0:fp8e4m3"]


def parse_point(text: str) -> tuple[int, int, int, bool, str]:
    head_dim, head_dim_v, context, causal, dtype = text.split(":")
    return int(head_dim), int(head_dim_v), int(context), causal == "1", dtype


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("points", nargs="*", default=POINTS, help="D:Dv:N:causal:dtype")
    parser.add_argument("--kernels", default="portable,sm90",
                        help="attention kernel settings to compare (tileattn.use_kernels)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--graph", action="store_true", help="time CUDA-graph replays")
    parser.add_argument("--out", default=None, help="output folder (default $OUT, else .)")
    args = parser.parse_args(argv)
    kernels = args.kernels.split(",")
    spin_up()
    rows = []
    for point in args.points:
        head_dim, head_dim_v, context, causal, dtype_name = parse_point(point)
        gen = torch.Generator(device="cuda").manual_seed(context + head_dim)
        q, k = (torch.randn(args.batch, context, args.heads, head_dim, device="cuda",
                            generator=gen) for _ in range(2))
        v = torch.randn(args.batch, context, args.heads, head_dim_v, device="cuda", generator=gen)
        dtype = TILEATTN_DTYPES[dtype_name]
        if dtype.itemsize == 2:
            inputs, descales = [x.to(dtype) for x in (q, k, v)], {}
        else:
            (q, qd), (k, kd), (v, vd) = (tileattn.quantize_fp8(x, dtype) for x in (q, k, v))
            inputs, descales = [q, k, v], dict(q_descale=qd, k_descale=kd, v_descale=vd)
        flops = 2 * args.batch * args.heads * context * context * (head_dim + head_dim_v)
        flops /= 2 if causal else 1
        row = dict(D=head_dim, Dv=head_dim_v, N=context, causal=causal, dtype=dtype_name)
        expected, _ = attention_reference(*(x[:1] for x in inputs), causal=causal, **descales)
        first = None
        for kernel in kernels:
            def call():
                return tileattn.attention(*inputs, causal=causal, **descales)
            with tileattn.use_kernels(attention=kernel):
                # The V the op hands to dispatch: K-major where the chip needs it for FP8.
                v_seen = tileattn.prepare_v(inputs[2]) if dtype.itemsize == 1 else inputs[2]
                ran = dispatch.attention_kernel(arch_of(q.device), inputs[0], inputs[1], v_seen,
                                                causal, dispatch.current())
                out = call().float()
                error = float((out[:1].double() - expected).norm() / expected.norm())
                if not error < CHECK_TOLERANCE[dtype_name]:
                    print(f"{point} {kernel}: error {error:.3g} against fp64, not timed")
                    continue
                if args.graph:
                    ms = triton.testing.do_bench_cudagraph(call, rep=200, return_mode="median")
                else:
                    ms = time_ms(call)
            first = out if first is None else first
            row[kernel] = dict(ran=ran, ms=ms, tflops=flops / ms / 1e9, error_vs_fp64=error,
                               rel_diff=float((out - first).norm() / first.norm()))
            del out
        rows.append(row)
        print(f"D={head_dim}/{head_dim_v} N={context} {'causal' if causal else 'full'} "
              f"{dtype_name}: " + "  ".join(
                  f"{name} ({r['ran']}) {r['ms']:.4f} ms {r['tflops']:.0f} TF/s"
                  f"{'' if r['rel_diff'] < 5e-2 else ' DIFFERS'}"
                  for name, r in row.items() if isinstance(r, dict)), flush=True)
        torch.cuda.empty_cache()
    path = write_json("prefill-ab", dict(device_facts(), graph=args.graph, batch=args.batch,
                                         heads=args.heads, rows=rows), args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
