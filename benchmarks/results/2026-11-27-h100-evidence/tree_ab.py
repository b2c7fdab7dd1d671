"""Interleaved A/B: old sm90 forward (HEAD: gl.max's FMNMX chain) vs working tree (tree row max).
POINTS kind:B:H:D:N:causal:dtype (kind dense|doc|softcap); outputs compared (max abs diff)."""
import json, os, sys, time, statistics, math
import torch
import tileattn
from tileattn.ops import call_cache
from tileattn.kernels.attention import sm90, _ab_old_sm90 as old
from tileattn.bench.common import spin_up, time_ms, device_facts
from tileattn.bench import flex_peer

new_launch, new_bind = sm90.attention_sm90_launch, sm90.bind_attention
def setv(name):
    sm90.attention_sm90_launch = old.attention_sm90_launch if name == "old" else new_launch
    sm90.bind_attention = old.bind_attention if name == "old" else new_bind
    call_cache.clear_all()

VARIANTS = ["old", "new"]
ROUNDS = int(os.environ.get("ROUNDS", 3))
POINTS = os.environ.get("POINTS").split()
def make(point):
    kind, B, H, D, N, causal, dt = point.split(":")
    B, H, D, N, causal = int(B), int(H), int(D), int(N), causal == "1"
    g = torch.Generator(device="cuda").manual_seed(N + D)
    fl = 4 * B * H * N * N * D / (2 if causal else 1)
    if kind in ("dense", "softcap"):
        q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        kw = dict(softcap=30.0) if kind == "softcap" else {}
        if dt == "fp8":
            (q, qd), (k, kd), (v, vd) = (tileattn.quantize_fp8(x, torch.float8_e4m3fn) for x in (q, k, v))
            kw.update(q_descale=qd, k_descale=kd, v_descale=vd)
        return (lambda: tileattn.attention(q, k, v, causal=causal, **kw)), fl
    from torch.nn.attention.flex_attention import create_block_mask
    from tileattn.flex import flex_attention
    gen = torch.Generator().manual_seed(16)
    cuts = torch.stack([torch.randperm(N - 1, generator=gen)[:15].sort().values + 1 for _ in range(B)])
    positions = torch.arange(N)
    ids = torch.stack([torch.searchsorted(c, positions, right=True) for c in cuts]).to(torch.int32).cuda()
    mask_mod = flex_peer.document_causal(ids)
    bm = create_block_mask(mask_mod, B, 1, N, N, device="cuda")
    fl = flex_peer.mask_flops(mask_mod, B, H, D, N, N, "cuda")
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    return (lambda: flex_attention(q, k, v, block_mask=bm)), fl

spin_up()
rows = []
t0 = time.time()
for point in POINTS:
    fn, fl = make(point)
    outs = {}
    for name in VARIANTS:
        setv(name)
        o = fn()
        outs[name] = (o[0] if isinstance(o, tuple) else o).float().clone()
    diff = (outs["new"] - outs["old"]).abs().max().item()
    times = {name: [] for name in VARIANTS}
    for r in range(ROUNDS):
        for name in (VARIANTS if r % 2 == 0 else VARIANTS[::-1]):
            setv(name); fn()
            times[name].append(time_ms(fn))
    for name in VARIANTS:
        ms = statistics.median(times[name])
        rows.append(dict(point=point, impl=name, ms=ms, ms_rounds=times[name], tflops=fl / ms / 1e9,
                         maxdiff_new_vs_old=diff))
    sel = {r["impl"]: r for r in rows if r["point"] == point}
    print(point, f"old={sel['old']['tflops']:.0f} new={sel['new']['tflops']:.0f} ratio={sel['new']['tflops']/sel['old']['tflops']:.3f} maxdiff={diff}", flush=True)
setv("new")
json.dump(dict(device=device_facts(), date=time.strftime("%Y-%m-%d"), rows=rows, seconds=time.time() - t0),
          open(os.path.join(os.environ.get("OUT", "."), os.environ.get("NAME", "tree-max-ab") + ".json"), "w"), indent=1)
