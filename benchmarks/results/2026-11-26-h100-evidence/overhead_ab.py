"""A/B: the persistent work lists' cost model with a per-tile overhead (OVH key blocks a tile on
top of its key blocks) for dense causal (scheduler.prefill) and flex block lists
(flex/tile_plan.py; today 4c+1, i.e. 0.25), interleaved rounds; caches cleared at each switch."""
import json, os, sys, time
import torch, triton, tileattn
from tileattn.scheduler import prefill as sp
from tileattn.flex import tile_plan as tp
from tileattn.ops.call_cache import clear_all
sys.path.insert(0, "benchmarks")
from flex_mods import masks_and_mods
from tileattn.bench import flex_peer
from tileattn.bench.common import spin_up
from torch.nn.attention.flex_attention import create_block_mask
T0 = time.time(); dev = "cuda"; D = 128; H = 32
orig_dense = sp.prefill_work_lists_python
orig_weighted = tp.weighted_work_lists_python
VARIANTS = [float(x) for x in os.environ.get("OVHS", "0,1,2").split(",")]

def use(ovh):
    def dense(num_m_blocks, num_batch_heads, causal, num_programs, group_heads=None):
        if not causal or ovh == 0:
            return orig_dense(num_m_blocks, num_batch_heads, causal, num_programs, group_heads)
        order = sp.prefill_tile_order_list(num_m_blocks, num_batch_heads, causal, group_heads)
        return sp._least_loaded_first(order, lambda t: t % num_m_blocks + 1 + ovh, num_programs)
    def weighted(costs, *args):
        return orig_weighted([c - 1 + round(4 * ovh) for c in costs] if ovh else costs, *args)
    sp.prefill_work_lists_python = dense
    tp.weighted_work_lists_python = weighted
    sp._prefill_work_lists_cached.cache_clear()
    tp._PLANS.clear() if hasattr(tp._PLANS, "clear") else None
    clear_all()

cases = {}
for n, b in ((1024, 64), (4096, 8), (16384, 4)):
    q, k, v = (torch.randn(b, n, H, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
    cases[f"causal{n}"] = (4 * b * H * D * n * n / 2, (lambda q=q, k=k, v=v: tileattn.attention(q, k, v, causal=True)))
n = 16384
qf, kf, vf = (torch.randn(4, H, n, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
for case in ("document", "causal"):
    mm, _, mb = masks_and_mods(case, n, dev)
    bm = create_block_mask(mm, mb, None, n, n, device=dev)
    cases[f"flex_{case}"] = (flex_peer.mask_flops(mm, mb, H, D, n, n, dev) * (4 // mb),
                             (lambda bm=bm: tileattn.flex_attention(qf, kf, vf, block_mask=bm)))
ref = {}
for ovh in VARIANTS:
    use(ovh)
    for name, (f, fn) in cases.items():
        out = fn().float(); torch.cuda.synchronize()
        if name not in ref: ref[name] = out
        elif not torch.equal(out, ref[name]):
            print("MISMATCH", name, ovh, float((out - ref[name]).abs().max()), flush=True)
print(f"[{time.time()-T0:.0f}s] compiled", flush=True)
spin_up(10)
table = {}
for r in range(int(os.environ.get("ROUNDS", "5"))):
    for name, (f, fn) in cases.items():
        for ovh in VARIANTS:
            use(ovh); fn(); torch.cuda.synchronize()
            table.setdefault(name, {}).setdefault(str(ovh), []).append(round(f / triton.testing.do_bench(fn, warmup=25, rep=150) / 1e9, 1))
    print(f"[{time.time()-T0:.0f}s] round {r}", flush=True)
for name, row in table.items():
    med = {k2: sorted(v2)[len(v2) // 2] for k2, v2 in row.items()}
    print(name, row, {k2: round(v2 / med[str(VARIANTS[0])], 3) for k2, v2 in med.items()}, flush=True)
use(0)
json.dump(table, open(os.path.join(os.environ.get("OUT", "."), "overhead-ab.json"), "w"), indent=1)
