"""A/B of MLA kernel variants on the same inputs and plan. A variant is a set of environment
variables read at launch time (TILEATTN_MLA_KERNEL=triton|gluon, TILEATTN_MLA_PREFETCH=n),
given as JSON in $MLA_AB_VARIANTS ({"name": {"VAR": "value"}}; set every variable in every
variant, since they persist; "" unsets one); the pseudo-variable MIN_CHUNK=n plans with the
chip's config but that min_chunk (fewest keys per split-KV work item), MAX_SPLITS=n with that
cap on work items per sequence (0: none; mla_decode.MAX_SPLITS_PER_SEQ). Outputs are compared with the first variant's, times taken
with do_bench (median; MLA_AB_GRAPH=1: do_bench_cudagraph, for small batches where the eager
time is host overhead), JSON written under $OUT.
Usage: python benchmarks/mla_sm90_ab.py [batch:seq:heads[:q_len][:bf16|fp8] ...]"""

import dataclasses
import json
import math
import os
import sys

import torch
import triton

import tileattn
from tileattn.api import plan_for_config
from tileattn.kernels.mla import decode as mla_kernels
from tileattn.bench.common import copy_gbps, device_facts, spin_up
from tileattn.bench.mla import _make_cache

SHAPES = ["768:2048:128", "768:2048:64", "128:8192:128", "768:1024:64", "32:8192:64",
          "768:2048:32:2", "768:1024:128"]
default_cap = mla_kernels.MAX_SPLITS_PER_SEQ
VARIANTS = json.loads(os.environ.get("MLA_AB_VARIANTS", json.dumps({
    "gluon": {"TILEATTN_MLA_KERNEL": "gluon", "TILEATTN_MLA_PREFETCH": ""},
    "gluon-no-prefetch": {"TILEATTN_MLA_KERNEL": "gluon", "TILEATTN_MLA_PREFETCH": "0"},
    "triton": {"TILEATTN_MLA_KERNEL": "triton", "TILEATTN_MLA_PREFETCH": "0"}})))


def main(shapes):
    device = torch.device("cuda")
    facts = device_facts(device)
    copy = copy_gbps(device)
    spin_up()
    gen = torch.Generator(device=device).manual_seed(0)
    rows = []
    for shape in shapes:
        fields = shape.split(":")
        kv_name = fields.pop() if fields[-1] in ("bf16", "fp8") else "bf16"
        batch, seq_len, heads, *rest = (int(x) for x in fields)
        q_len = rest[0] if rest else 1
        kv, page_table, descale = _make_cache(batch, seq_len, 64, kv_name, device, gen)
        q = torch.randn(batch, q_len, heads, 576, device=device, generator=gen, dtype=torch.bfloat16)
        seq_lens = torch.full((batch,), seq_len, dtype=torch.int32, device=device)
        base_plan = tileattn.mla_plan(seq_lens, num_heads=heads, q_len=q_len, page_size=64,
                                      kv_dtype=kv.dtype, device=device)
        outs, row = {}, dict(batch=batch, seq_len=seq_len, heads=heads, q_len=q_len,
                             kv_dtype=kv_name, num_work=base_plan.num_work)
        for schedule, env in VARIANTS.items():
            plan = base_plan
            if env.get("MIN_CHUNK") or env.get("MAX_SPLITS"):
                mla_kernels.MAX_SPLITS_PER_SEQ = int(env.get("MAX_SPLITS") or default_cap) or None
                config = dataclasses.replace(base_plan.config, min_chunk=int(
                    env.get("MIN_CHUNK") or base_plan.config.min_chunk))
                plan = plan_for_config([seq_len] * batch, config, num_heads=heads, q_len=q_len,
                                       page_size=64, kv_dtype=kv.dtype, device=device)
                mla_kernels.MAX_SPLITS_PER_SEQ = default_cap
            row[schedule + "_num_work"] = plan.num_work
            call = lambda plan=plan: tileattn.mla_decode(
                q, kv, page_table, seq_lens, softmax_scale=1 / math.sqrt(192), kv_descale=descale,
                plan=plan)
            for name, value in env.items():   # "" unsets: the library's default
                if name in ("MIN_CHUNK", "MAX_SPLITS"):
                    continue
                if value:
                    os.environ[name] = value
                else:
                    os.environ.pop(name, None)
            outs[schedule] = call().float()
            torch.cuda.synchronize()
            if os.environ.get("MLA_AB_GRAPH") == "1":
                ms = triton.testing.do_bench_cudagraph(call, rep=200, return_mode="median")
            else:
                ms = triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median")
            kv_bytes = batch * seq_len * 576 * kv.element_size()
            flops = 2 * heads * q_len * 1088 * batch * seq_len
            row[schedule] = dict(ms=ms, copy_fraction=kv_bytes / ms / 1e6 / copy, tflops=flops / ms / 1e9)
        first = next(iter(outs.values()))
        for schedule, out in outs.items():
            row[schedule]["rel_diff"] = float((out - first).norm() / first.norm())
            row[schedule]["finite"] = bool(torch.isfinite(out).all())
        rows.append(row)
        print(f"b{batch} s{seq_len} h{heads} q{q_len} {kv_name}: " + "  ".join(
            f"{name} {r['ms']:.4f} ms {r['tflops']:.0f} TF {r['copy_fraction']:.2f} copy"
            f"{'' if r['rel_diff'] < 1e-2 and r['finite'] else ' WRONG'}"
            for name, r in row.items() if isinstance(r, dict)), flush=True)
    out_dir = os.environ.get("OUT", "/tmp")
    with open(os.path.join(out_dir, "mla-sm90-ab.json"), "w") as f:
        json.dump(dict(facts, copy_gbps=copy, rows=rows), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:] or SHAPES)
