"""One attention or MLA decode shape for a profiler.

Runs the call three times (compile, warm, profiled), so Nsight Compute sees the third launch:

    ncu --launch-skip 2 --launch-count 1 -k regex:attention python benchmarks/profile_shape.py \\
        prefill 128 fp8e4m3-vT 16384 0 --kernel portable
    ncu --launch-skip 2 --launch-count 1 -k regex:mla_decode_partial python \\
        benchmarks/profile_shape.py mla 16 fp8

(benchmarks/gpu.sh's ncu-prefill / ncu-mla steps add the sections and metrics). With
--kernel-times it prints torch.profiler's per-kernel CUDA times over 10 calls instead, the
quickest way to see what each launch of a call costs (e.g. partial vs combine at small MLA
batches, where the eager time is mostly host).

    python benchmarks/profile_shape.py prefill D COLUMN N CAUSAL [--kernel auto|portable|sm90|cudnn]
    python benchmarks/profile_shape.py mla HEADS {bf16,fp8} [--batch 768] [--seq-len 2048]
        [--q-len 1] [--kernel auto|triton|gluon]

COLUMN is a column of the prefill grid (bf16, fp16, fp8e4m3, fp8e4m3-vT, fp8e5m2), CAUSAL 0/1;
prefill runs at B=4, H=32 like the grid.
"""

from __future__ import annotations

import argparse
import contextlib

import torch

import tileattn
from tileattn.bench import prefill
from tileattn.bench.mla import HEAD_DIM_QK, make_cache


def prefill_call(args):
    kernel = "auto" if args.kernel in ("auto", "cudnn") else args.kernel
    table = prefill.providers()
    prepare, call = table[("cudnn" if args.kernel == "cudnn" else "tileattn", args.column)]
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (prefill.BATCH, args.context, prefill.HEADS, args.head_dim)
    q, k, v = (torch.randn(shape, device="cuda", generator=gen) for _ in range(3))
    inputs, kwargs = prepare(q, k, v)
    return (lambda: call(*inputs, bool(args.causal), **kwargs)), dict(attention=kernel)


def mla_call(args):
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    kv, page_table, descale = make_cache(args.batch, args.seq_len, 64, args.kv, device, gen)
    q = torch.randn(args.batch, args.q_len, args.heads, HEAD_DIM_QK, device=device, generator=gen,
                    dtype=torch.bfloat16)
    seq_lens = torch.full((args.batch,), args.seq_len, dtype=torch.int32, device=device)
    plan = tileattn.mla_plan(seq_lens, num_heads=args.heads, q_len=args.q_len, page_size=64,
                             kv_dtype=kv.dtype, device=device,
                             kernel=None if args.kernel == "auto" else args.kernel)
    print(f"MLA plan: {plan.num_work} work items, {plan.num_slots} split slots, "
          f"kernel {plan.kernel}")
    return (lambda: tileattn.mla_decode(q, kv, page_table, seq_lens, softmax_scale=0.07,
                                        kv_descale=descale, plan=plan)), {}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shapes = parser.add_subparsers(dest="op", required=True)
    one = shapes.add_parser("prefill", help="attention() at B=4 H=32")
    one.add_argument("head_dim", type=int)
    one.add_argument("column")
    one.add_argument("context", type=int)
    one.add_argument("causal", type=int, choices=(0, 1))
    one.add_argument("--kernel", default="auto", choices=("auto", "portable", "sm90", "cudnn"))
    mla = shapes.add_parser("mla", help="mla_decode() with a plan")
    mla.add_argument("heads", type=int)
    mla.add_argument("kv", choices=("bf16", "fp8"))
    mla.add_argument("--batch", type=int, default=768)
    mla.add_argument("--seq-len", type=int, default=2048)
    mla.add_argument("--q-len", type=int, default=1)
    mla.add_argument("--kernel", default="auto", choices=("auto", "triton", "gluon"))
    for sub in (one, mla):
        sub.add_argument("--kernel-times", action="store_true",
                         help="print torch.profiler's per-kernel times over 10 calls")
    args = parser.parse_args(argv)

    call, settings = prefill_call(args) if args.op == "prefill" else mla_call(args)
    with tileattn.use_kernels(**settings) if settings else contextlib.nullcontext():
        for _ in range(3 if not args.kernel_times else 5):
            call()
        torch.cuda.synchronize()
        if args.kernel_times:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CUDA]) as report:
                for _ in range(10):
                    call()
                torch.cuda.synchronize()
            print(report.key_averages().table(sort_by="cuda_time_total", row_limit=8))
    print("profiled", vars(args))


if __name__ == "__main__":
    main()
