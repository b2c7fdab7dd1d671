"""FP8 prefill against cuDNN's FP8 and against bf16, and what quantize_qkv_fp8's scale settings
cost (issue 19's speed and cost bars), all in one run on one GPU.

Per point (B=4, H=32, D, N, causal; ../shared/BENCHMARKS.md's shapes and FLOP count), columns:
    tileattn-fp8        attention() on e4m3 per-tensor inputs, V row-major (its transposition
                        to K-major timed, as the prefill grid times it)
    tileattn-fp8-block  attention() on quantize_qkv_fp8(per="block", smooth_k, rotate)'s inputs
                        (block descales applied per tile; V K-major as quantize_qkv_fp8 returns it)
    cudnn-fp8           cudnn-frontend sdpa_fp8 (e4m3 in and out), when the wheel is installed
    tileattn-bf16, cudnn-bf16
and at --cost-points the end-to-end cost of quantizing bf16 q/k/v and attending:
    quantize+attention per setting (tensor; block+smooth+rotate), ms (the median of
    common.ROUNDS interleaved rounds, as the backward and mods grids time their points;
    ms_rounds keeps each) and the ratio to tensor.
Every timed call is first checked against cuDNN bf16 of the same point.

    python benchmarks/fp8_prefill.py [--head-dims 128 256] [--contexts 1024 4096 16384]
                                     [--cost-only] [--out DIR]

Output: the results file <gpu>/fp8.json under --out (default benchmarks/results in a checkout;
fp8-partial.json for a subset of the default points). `bash benchmarks/gpu.sh fp8` runs it.
"""

from __future__ import annotations

import argparse
import statistics

import torch

import tileattn
from tileattn.bench import prefill
from tileattn.bench.common import (device_facts, spin_up, time_interleaved, time_ms,
                                   write_results)

E4M3 = torch.float8_e4m3fn
BEST = dict(per="block", smooth_k=True, rotate=True)
CHECK_TOLERANCE = 1e-1
HEAD_DIMS, CONTEXTS = (128, 256), (1024, 4096, 16384)


def _columns():
    """name -> (prepare(q, k, v) -> (args, kwargs), run(*args, causal, **kwargs))."""
    from torch.nn.attention import SDPBackend

    def fp8_tensor(q, k, v):
        (q8, qd), (k8, kd), (v8, vd) = (tileattn.quantize_fp8(x, E4M3) for x in (q, k, v))
        return (q8, k8, v8), dict(q_descale=qd, k_descale=kd, v_descale=vd)

    def fp8_block(q, k, v):
        q8, k8, v8, scales = tileattn.quantize_qkv_fp8(q, k, v, **BEST)
        return (q8, k8, v8), dict(scales)

    attend = lambda q, k, v, causal, **d: tileattn.attention(q, k, v, causal=causal, **d)
    bf16 = lambda q, k, v: ((q.bfloat16(), k.bfloat16(), v.bfloat16()), {})
    cudnn_bf16 = prefill._sdpa(SDPBackend.CUDNN_ATTENTION)
    columns = {"tileattn-fp8": (fp8_tensor, attend), "tileattn-fp8-block": (fp8_block, attend),
               "tileattn-bf16": (bf16, attend),
               "cudnn-bf16": (bf16, lambda q, k, v, causal: cudnn_bf16(q, k, v, causal))}
    try:
        cudnn_fp8 = prefill._cudnn_fp8()
        columns["cudnn-fp8"] = (fp8_tensor, cudnn_fp8)
    except Exception as error:  # noqa: BLE001 - the wheel is optional (benchmarks/README.md)
        print(f"cudnn-frontend FP8 unavailable: {type(error).__name__}: {error}")
    return columns


def _relative(out, ref) -> float:
    return float((out.float() - ref).norm() / ref.norm())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", type=int, nargs="+", default=list(HEAD_DIMS))
    parser.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS))
    parser.add_argument("--cost-points", default="128:16384",
                        help="D:N points for the quantize+attention cost (comma-separated)")
    parser.add_argument("--cost-only", action="store_true",
                        help="only the quantize+attention cost (a partial results file)")
    parser.add_argument("--out", default=None, help="results folder (see above)")
    args = parser.parse_args(argv)
    columns = _columns()
    spin_up()
    rows = []
    for head_dim in [] if args.cost_only else args.head_dims:
        for context in args.contexts:
            for causal in (False, True):
                gen = torch.Generator(device="cuda").manual_seed(context + head_dim)
                q, k, v = (torch.randn(prefill.BATCH, context, prefill.HEADS, head_dim,
                                       device="cuda", generator=gen) for _ in range(3))
                outputs, point = {}, []
                for name, (prepare, run) in columns.items():
                    inputs, kwargs = prepare(q, k, v)
                    call = lambda: run(*inputs, causal, **kwargs)
                    outputs[name] = call()
                    point.append(dict(D=head_dim, N=context, causal=causal, impl=name,
                                      ms=time_ms(call)))
                ref = outputs["cudnn-bf16"].float()
                for row in point:
                    row["rel_error_vs_cudnn_bf16"] = _relative(outputs[row["impl"]], ref)
                    row["tflops"] = prefill.flops(context, head_dim, causal) / row["ms"] / 1e9
                    if row["rel_error_vs_cudnn_bf16"] > CHECK_TOLERANCE:
                        raise RuntimeError(f"{row} is off from cuDNN bf16")
                rows += point
                print(f"D={head_dim} N={context:5} causal={causal!s:5} " + "  ".join(
                    f"{row['impl']} {row['tflops']:.0f}" for row in point), flush=True)
    cost = []
    for point in args.cost_points.split(","):
        head_dim, context = (int(x) for x in point.split(":"))
        q, k, v = (torch.randn(prefill.BATCH, context, prefill.HEADS, head_dim, device="cuda",
                               dtype=torch.bfloat16) for _ in range(3))
        for causal in (False, True):
            calls = {}
            for setting_name, setting in (("tensor", dict(per="tensor")),
                                          ("block+smooth+rotate", BEST)):
                def end_to_end(setting=setting):
                    q8, k8, v8, scales = tileattn.quantize_qkv_fp8(q, k, v, **setting)
                    return tileattn.attention(q8, k8, v8, causal=causal, **scales)
                end_to_end()
                calls[setting_name] = end_to_end
            rounds = time_interleaved(calls)
            times = {name: statistics.median(ms) for name, ms in rounds.items()}
            ratio = times["block+smooth+rotate"] / times["tensor"]
            cost.append(dict(D=head_dim, N=context, causal=causal, ms=times, ms_rounds=rounds,
                             ratio=ratio))
            print(f"quantize+attention D={head_dim} N={context} causal={causal}: "
                  f"{times} block+smooth+rotate/tensor {ratio:.3f}", flush=True)
    complete = (not args.cost_only and set(args.head_dims) >= set(HEAD_DIMS)
                and set(args.contexts) >= set(CONTEXTS))
    path = write_results("fp8", dict(device_facts(), rows=rows, cost=cost), args.out, complete)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
