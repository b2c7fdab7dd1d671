"""How much a 192-row tile with one (or two) warpgroups of rows costs against a full one, with
idle warpgroups computing (base) or shadowing (sm90.SHADOW_IDLE): one program a tile, many
waves, seqlen_q = 192 + tail rows; the tail tiles' cost = T(192 + tail) - T(192)."""
import json, os, time, statistics
import torch
from tileattn.ops import call_cache
from tileattn.kernels.attention import sm90
from tileattn.bench.common import spin_up, time_ms, device_facts

cfg = sm90.LONG_QUERY_CONFIGS[64]
B, H, NK, D = 2, 132, 8192, 64
g = torch.Generator(device="cuda").manual_seed(0)
k = torch.randn(B, NK, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
v = torch.randn_like(k)
res = {}
spin_up()
for r in range(3):
    for name in ("base", "shadow") if r % 2 == 0 else ("shadow", "base"):
        sm90.SHADOW_IDLE = name == "shadow"
        for nq in (192, 256, 320, 384):
            q = torch.randn(B, nq, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
            out = torch.empty_like(q)
            tiles = B * H * -(-nq // 192)
            launch = sm90.attention_sm90_launch(q, k, v, out, None, D ** -0.5, False, config=cfg,
                                                num_programs=tiles)
            fn = launch.run
            fn(); torch.cuda.synchronize()
            res.setdefault((name, nq), []).append(time_ms(fn))
rows = []
for name in ("base", "shadow"):
    t = {nq: statistics.median(res[(name, nq)]) for nq in (192, 256, 320, 384)}
    full = t[384] - t[192]
    row = dict(impl=name, ms=t, tail64_vs_full=(t[256] - t[192]) / full, tail128_vs_full=(t[320] - t[192]) / full)
    rows.append(row); print(row, flush=True)
json.dump(dict(device=device_facts(), date=time.strftime("%Y-%m-%d"), rounds={f"{a}-{b}": v for (a, b), v in res.items()}, rows=rows),
          open(os.path.join(os.environ.get("OUT", "."), "lone-tile-probe.json"), "w"), indent=1)
