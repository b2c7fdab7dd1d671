"""Timing sweep of the MLA combine kernel alone over its tile knobs.

Plans of real split-KV shapes get random partial results; each variant of
kernels/mla/combine.py's launch (rows, columns, most slots per step, warps) merges them, its
output is checked against an fp64 merge and it is timed from a CUDA graph (do_bench_cudagraph
median). This fills COMBINE_ROWS / COMBINE_COLUMNS / COMBINE_MAX_SLOTS_PER_STEP / COMBINE_WARPS
(docs/design.md, "MLA decode").

    python benchmarks/mla_combine_sweep.py [--out DIR] [batch:seq_len:heads ...]

Output: mla-combine-sweep.json under --out ($OUT, else the current directory).
"""

from __future__ import annotations

import argparse

import torch
import triton

import tileattn
from tileattn.bench.common import device_facts, write_json
from tileattn.kernels.split_kv_combine import (COMBINE_COLUMNS, COMBINE_MAX_SLOTS_PER_STEP, COMBINE_ROWS,
                                               COMBINE_WARPS, combine_launches)

TABLE = (COMBINE_ROWS, COMBINE_COLUMNS, COMBINE_MAX_SLOTS_PER_STEP, COMBINE_WARPS)
SHAPES = ["32:8192:64", "32:8192:32", "32:8192:16", "1:8192:64", "1:8192:16", "128:8192:128",
          "8:8192:128"]
# (rows, columns, most slots per step, warps), besides the table's TABLE.
VARIANTS = [(16, 32, 16, 4), (16, 64, 64, 4), (16, 128, 64, 4), (32, 64, 64, 4),
            (16, 128, 64, 8), (32, 128, 64, 8), (64, 64, 64, 8), (16, 64, 16, 4), (32, 32, 64, 4)]


def reference(plan, num_rows):
    """The fp64 merge of each split sequence's slots by their LSEs, and the slot bounds."""
    out = torch.empty(plan.batch, num_rows, 512, dtype=torch.float64, device=plan.work.device)
    slots = plan.batch_slots.tolist()
    for b in range(plan.batch):
        if slots[b + 1] > slots[b]:
            lse = plan.partial_lse[slots[b]:slots[b + 1]].double()
            w = torch.softmax(lse, 0)
            out[b] = (plan.partial_out[slots[b]:slots[b + 1]].double() * w[:, :, None]).sum(0)
    return out, slots


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="*", default=SHAPES, help="batch:seq_len:heads")
    parser.add_argument("--out", default=None, help="output folder (default $OUT, else .)")
    args = parser.parse_args(argv)
    variants = [TABLE, *(v for v in VARIANTS if v != TABLE)]
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    rows = []
    for shape in args.shapes:
        batch, seq_len, heads = (int(x) for x in shape.split(":"))
        seq_lens = torch.full((batch,), seq_len, dtype=torch.int32, device=device)
        plan = tileattn.mla_plan(seq_lens, num_heads=heads, page_size=64, kv_dtype=torch.bfloat16,
                                 device=device)
        if plan.num_slots == 0:
            print(shape, "no slots: nothing to combine")
            continue
        plan.partial_out.copy_(torch.randn(plan.partial_out.shape, device=device, generator=gen))
        plan.partial_lse.copy_(torch.randn(plan.partial_lse.shape, device=device, generator=gen) * 3)
        q = torch.empty(batch, 1, heads, 576, device=device, dtype=torch.bfloat16)
        out = torch.empty(batch, 1, heads, 512, device=device, dtype=torch.bfloat16)
        lse = torch.empty(batch, 1, heads, device=device, dtype=torch.float32)
        want, slots = reference(plan, heads)
        has = [b for b in range(batch) if slots[b + 1] > slots[b]]
        row = dict(batch=batch, seq_len=seq_len, heads=heads, num_slots=plan.num_slots,
                   max_slots_per_seq=plan.max_slots_per_seq,
                   bytes=plan.num_slots * heads * 512 * 4)
        for r, c, s, w in variants:
            (launch,) = combine_launches(q, out, lse, plan, rows=r, columns=c,
                                         max_slots_per_step=s, num_warps=w)
            out.fill_(float("nan"))
            launch.run()
            err = float((out[has, 0].double() - want[has]).abs().max())
            ms = triton.testing.do_bench_cudagraph(launch.run, rep=100, return_mode="median")
            name = f"r{r}c{c}s{s}w{w}"
            row[name] = dict(us=ms * 1e3, max_err=err)
        rows.append(row)
        print(shape, plan.num_slots, "slots", plan.max_slots_per_seq, "per seq:", "  ".join(
            f"{k} {v['us']:.1f}us{'' if v['max_err'] < 2e-2 else ' WRONG %.3g' % v['max_err']}"
            for k, v in row.items() if isinstance(v, dict)), flush=True)
    path = write_json("mla-combine-sweep", dict(device_facts(device), rows=rows), args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
