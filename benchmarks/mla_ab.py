"""A/B of MLA decode variants: partial kernel, config row, split-KV cap, on the same inputs.

Each variant makes its own plan for the same batch (ops/mla.py plan_for_config: the chip's
config row with the variant's changes, the variant's partial kernel, its split cap) and runs
tileattn.mla_decode with it; outputs are compared with the first variant's and, for the first
sequences, with the fp64 reference before they are timed. Times are do_bench medians of the eager call (host path included) or, with --graph, CUDA-graph replays:
what a serving engine's captured decode step sees, and the only fair timing at small batches,
where the eager call is host-bound. This decides dispatch.mla_kernel, the MLA config tables
and the split-KV limits (docs/design.md, "MLA decode").

    python benchmarks/mla_ab.py [--preset kernels|configs] [--variants JSON] [--graph]
        [--out DIR] [batch:seq_len:heads[:q_len][:bf16|fp8] ...]

A variant is a JSON object: {"kernel": "triton" | "gluon" (default: the chip's choice),
"schedule": "split_dv" | "dup_qk", "config": {MLAConfig field: value}, "max_splits": n (the
most work items per sequence; 0: no cap)}; --variants takes {"name": variant, ...}. Caveat of
--graph: do_bench_cudagraph does not flush L2, so caches under ~40 MB stay L2-warm.
Output: mla-ab.json under --out ($OUT, else the current directory).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

import torch
import triton

import tileattn
from tileattn import dispatch
from tileattn.arch import arch_of
from tileattn.bench.common import copy_gbps, device_facts, spin_up, write_json
from tileattn.bench.mla import CHECK_TOLERANCE, HEAD_DIM_QK, HEAD_DIM_V, make_cache
from tileattn.kernels.mla import decode as mla_kernels
from tileattn.ops.mla import plan_for_config
from tileattn.reference import mla_decode_reference

SCALE = 1 / math.sqrt(192)   # DeepSeek's softmax scale (qk_nope 128 + rope 64)
SHAPES = ["768:2048:128", "768:2048:64", "128:8192:128", "768:1024:64", "32:8192:64",
          "768:2048:32:2", "32:8192:16", "768:2048:16:fp8"]
PRESETS = {
    # The two partial kernels on sm90 (Gluon needs >= 32 rows and pages of 64).
    "kernels": {"gluon": {"kernel": "gluon"}, "triton": {"kernel": "triton"}},
    # Rows of the Triton kernel's config table around the chip's split_dv row.
    "configs": {name: {"kernel": "triton", "config": changes} for name, changes in (
        ("table", {}), ("2/SM", {"programs_per_sm": 2}), ("3/SM", {"programs_per_sm": 3}),
        ("N64", {"block_n": 64}), ("N16s3", {"block_n": 16, "num_stages": 3}),
        ("w4", {"num_warps": 4}), ("s3", {"num_stages": 3}))},
}


def parse_shape(text: str) -> tuple[int, int, int, int, str]:
    fields = text.split(":")
    kv_name = fields.pop() if fields[-1] in ("bf16", "fp8") else "bf16"
    batch, seq_len, heads, *rest = (int(x) for x in fields)
    return batch, seq_len, heads, (rest[0] if rest else 1), kv_name


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="*", default=SHAPES,
                        help="batch:seq_len:heads[:q_len][:bf16|fp8]")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="kernels")
    parser.add_argument("--variants", default=None, help='JSON {"name": variant, ...}')
    parser.add_argument("--page-size", type=int, default=64)
    parser.add_argument("--graph", action="store_true", help="time CUDA-graph replays")
    parser.add_argument("--out", default=None, help="output folder (default $OUT, else .)")
    args = parser.parse_args(argv)
    variants = json.loads(args.variants) if args.variants else PRESETS[args.preset]
    device = torch.device("cuda")
    arch = arch_of(device)
    copy = copy_gbps(device)
    spin_up()
    gen = torch.Generator(device=device).manual_seed(0)
    rows = []
    for shape in args.shapes:
        batch, seq_len, heads, q_len, kv_name = parse_shape(shape)
        kv, page_table, descale = make_cache(batch, seq_len, args.page_size, kv_name, device, gen)
        q = torch.randn(batch, q_len, heads, HEAD_DIM_QK, device=device, generator=gen,
                        dtype=torch.bfloat16)
        seq_lens = torch.full((batch,), seq_len, dtype=torch.int32, device=device)
        io_bytes = (batch * seq_len * HEAD_DIM_QK * kv.element_size() + q.numel() * 2
                    + batch * q_len * heads * HEAD_DIM_V * 2)
        flops = 2 * heads * q_len * (HEAD_DIM_QK + HEAD_DIM_V) * batch * seq_len
        row = dict(batch=batch, seq_len=seq_len, heads=heads, q_len=q_len, kv_dtype=kv_name)
        checked = min(batch, 4)   # the reference loops over sequences in Python
        expected, _ = mla_decode_reference(q[:checked], kv, page_table[:checked],
                                           seq_lens[:checked], softmax_scale=SCALE,
                                           kv_descale=descale)
        first = None
        for name, variant in variants.items():
            try:
                config = mla_kernels.config_for(arch, variant.get("schedule"), heads * q_len)
                config = dataclasses.replace(config, **variant.get("config", {}))
                kernel = variant.get("kernel") or dispatch.mla_kernel(
                    arch, heads * q_len, args.page_size, kv.dtype, config.schedule,
                    dispatch.current())
                plan = plan_for_config([seq_len] * batch, config, num_heads=heads, q_len=q_len,
                                       page_size=args.page_size, kv_dtype=kv.dtype,
                                       device=device, kernel=kernel,
                                       max_splits_per_seq=variant.get("max_splits"))

                def call(plan=plan):
                    return tileattn.mla_decode(q, kv, page_table, seq_lens, plan=plan,
                                               softmax_scale=SCALE, kv_descale=descale)
                out = call().float()
                error = float((out[:checked].double() - expected).norm() / expected.norm())
                if not error < CHECK_TOLERANCE:
                    raise AssertionError(f"error {error:.3g} against fp64, not timed")
                if args.graph:
                    ms = triton.testing.do_bench_cudagraph(call, rep=200, return_mode="median")
                else:
                    ms = triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median")
            except Exception as error:  # noqa: BLE001 - a variant the shape rules out
                print(f"{shape} {name}: {type(error).__name__} {str(error)[:160]}")
                continue
            first = out if first is None else first
            row[name] = dict(kernel=plan.kernel, config=dataclasses.asdict(config),
                             num_work=plan.num_work, ms=ms, copy_fraction=io_bytes / ms / 1e6 / copy,
                             tflops=flops / ms / 1e9, error_vs_fp64=error,
                             finite=bool(torch.isfinite(out).all()),
                             rel_diff=float((out - first).norm() / first.norm()))
        rows.append(row)
        print(f"{shape}: " + "  ".join(
            f"{name} ({r['kernel']}, {r['num_work']} items) {r['ms']:.4f} ms "
            f"{r['copy_fraction']:.2f} copy {r['tflops']:.0f} TF/s"
            f"{'' if r['finite'] and r['rel_diff'] < 1e-2 else ' WRONG'}"
            for name, r in row.items() if isinstance(r, dict)), flush=True)
        torch.cuda.empty_cache()
    path = write_json("mla-ab", dict(device_facts(), copy_gbps=copy, graph=args.graph,
                                     page_size=args.page_size, variants=variants, rows=rows),
                      args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
