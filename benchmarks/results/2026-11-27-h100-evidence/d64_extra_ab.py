"""D=64 CONFIGS row: 3 vs 2 stages on packed (varlen) and block-list (flex) calls, interleaved."""
import json, os, time, collections
import torch
import tileattn
from tileattn.ops import call_cache
from tileattn.kernels.attention import sm90
from tileattn.bench.common import spin_up, time_ms, device_facts
from torch.nn.attention.flex_attention import create_block_mask

C = sm90.Sm90Config
ROWS = {"s3": C(128, 3, split=True), "s2": C(128, 2, split=True)}
def setv(name):
    sm90.CONFIGS[64] = ROWS[name]; call_cache.clear_all()

g = torch.Generator(device="cuda").manual_seed(7)
H, D = 32, 64
lens = torch.randint(128, 4097, (12,), generator=g, device="cuda").tolist()
cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
tot = int(cu[-1]); mx = max(lens)
qv, kv, vv = (torch.randn(tot, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
vis_c = sum(l * (l + 1) / 2 for l in lens); vis_n = sum(l * l for l in lens)
B, N = 4, 4096
qf, kf, vf = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
doc = torch.repeat_interleave(torch.arange(8, device="cuda"), N // 8)
causal_bm = create_block_mask(lambda b, h, q, k: q >= k, None, None, N, N)
doc_bm = create_block_mask(lambda b, h, q, k: (doc[q] == doc[k]) & (q >= k), None, None, N, N)
cases = {
    "varlen-causal": (lambda: tileattn.attention_varlen(qv, kv, vv, cu, cu, mx, mx, causal=True), 4 * D * H * vis_c),
    "varlen": (lambda: tileattn.attention_varlen(qv, kv, vv, cu, cu, mx, mx), 4 * D * H * vis_n),
    "flex-causal": (lambda: tileattn.flex_attention(qf, kf, vf, block_mask=causal_bm), 4 * D * H * B * N * (N + 1) / 2),
    "flex-document": (lambda: tileattn.flex_attention(qf, kf, vf, block_mask=doc_bm), 4 * D * H * B * 8 * (N // 8) * (N // 8 + 1) / 2),
}
spin_up()
rows, first = [], {}
for r in range(3):
    for case, (fn, fl) in cases.items():
        for name in ("s3", "s2"):
            setv(name)
            o = fn().float()
            diff = None
            if r == 0:
                diff = 0.0 if case not in first else (o - first[case]).abs().max().item()
                first.setdefault(case, o)
            ms = time_ms(fn)
            rows.append(dict(round=r, case=case, impl=name, ms=ms, tflops=fl / ms / 1e9, maxdiff_vs_first=diff))
            print(rows[-1], flush=True)
setv("s3")
agg = collections.defaultdict(list)
for x in rows: agg[(x["case"], x["impl"])].append(x["tflops"])
print("SUMMARY")
for k, v in agg.items(): v = sorted(v); print(k, round(v[1], 1), [round(t) for t in v])
json.dump(dict(device=device_facts(), lens=lens, rows=rows), open(os.path.join(os.environ.get("OUT", "."), "d64-stages-extra-ab.json"), "w"), indent=1)
