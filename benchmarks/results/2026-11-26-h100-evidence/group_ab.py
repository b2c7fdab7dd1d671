"""A/B: causal work lists' head-group size (scheduler.prefill heads_per_group; today min(8,
16 MB / K+V bytes of a head)) for dense causal N=1024 and 4096, interleaved; caches cleared."""
import json, os, time
import torch, triton, tileattn
from tileattn.kernels.attention import sm90
from tileattn.scheduler import prefill as sp
from tileattn.ops.call_cache import clear_all
from tileattn.bench.common import spin_up
T0 = time.time(); dev = "cuda"; D = 128; H = 32
orig = sm90.heads_per_group
VARIANTS = [int(x) for x in os.environ.get("GROUPS", "0,2,16,64").split(",")]
def use(g):
    sm90.heads_per_group = orig if g == 0 else (lambda causal, *a: g if causal else 1)
    sp._prefill_work_lists_cached.cache_clear(); clear_all()
cases = {}
for n, b in ((1024, 64), (4096, 8)):
    q, k, v = (torch.randn(b, n, H, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
    cases[f"causal{n}"] = (4 * b * H * D * n * n / 2, (lambda q=q, k=k, v=v: tileattn.attention(q, k, v, causal=True)))
for g in VARIANTS:
    use(g)
    for f, fn in cases.values(): fn()
torch.cuda.synchronize(); spin_up(10)
table = {}
for r in range(int(os.environ.get("ROUNDS", "5"))):
    for name, (f, fn) in cases.items():
        for g in VARIANTS:
            use(g); fn(); torch.cuda.synchronize()
            table.setdefault(name, {}).setdefault(str(g), []).append(round(f / triton.testing.do_bench(fn, warmup=25, rep=150) / 1e9, 1))
for name, row in table.items():
    med = {k2: sorted(v2)[len(v2) // 2] for k2, v2 in row.items()}
    print(name, row, {k2: round(v2 / med[str(VARIANTS[0])], 3) for k2, v2 in med.items()}, flush=True)
use(0)
json.dump(table, open(os.path.join(os.environ.get("OUT", "."), "group-ab.json"), "w"), indent=1)
