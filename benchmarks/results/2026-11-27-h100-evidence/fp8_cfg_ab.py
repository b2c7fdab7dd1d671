"""Interleaved A/B of FP8_CONFIGS rows (sm90 forward): VARIANTS name=D:block_m:block_n:stages,...
Outputs compared against the base variant (max abs diff) and fp64 rel error on a slice."""
import json, os, sys, time, statistics, math, dataclasses
import torch
import tileattn
from tileattn.ops import call_cache
from tileattn.kernels.attention import sm90
from tileattn.bench.common import spin_up, time_ms, device_facts

BASE = dict(sm90.FP8_CONFIGS)
VARIANTS = {"base": {}}
for spec in os.environ.get("VARIANTS", "t3s3=128:192:64:3 t3s4=128:192:64:4").split():
    name, rows = spec.split("=")
    VARIANTS[name] = {}
    for row in rows.split(","):
        d, bm, bn, st = map(int, row.split(":"))
        VARIANTS[name][d] = sm90.Sm90Config(bn, st, block_m=bm, split=True)
def setv(name):
    sm90.FP8_CONFIGS.clear(); sm90.FP8_CONFIGS.update(BASE); sm90.FP8_CONFIGS.update(VARIANTS[name])
    call_cache.clear_all()

ROUNDS = int(os.environ.get("ROUNDS", 3))
POINTS = os.environ.get("POINTS", "4:32:128:16384:0 4:32:128:16384:1 4:32:128:4096:0 4:32:128:4096:1 4:32:128:1024:0 4:32:64:16384:0").split()
spin_up()
rows = []
t0 = time.time()
for point in POINTS:
    B, H, D, N, causal = map(int, point.split(":"))
    g = torch.Generator(device="cuda").manual_seed(N + D)
    q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    (q8, qd), (k8, kd), (v8, vd) = (tileattn.quantize_fp8(x, torch.float8_e4m3fn) for x in (q, k, v))
    fn = lambda: tileattn.attention(q8, k8, v8, causal=bool(causal), q_descale=qd, k_descale=kd, v_descale=vd)
    fl = 4 * B * H * N * N * D / (2 if causal else 1)
    ref = None
    outs, errs = {}, {}
    # fp64 reference on head 0 of batch 0, 256 last rows
    qs, ks, vs = (x.float() * d for x, d in ((q8, qd), (k8, kd), (v8, vd)))
    rq = qs[0, -256:, 0].double(); rk = ks[0, :, 0].double(); rv = vs[0, :, 0].double()
    sc = rq @ rk.T / math.sqrt(D)
    if causal:
        qi = torch.arange(N - 256, N, device="cuda")[:, None]; sc = sc.masked_fill(torch.arange(N, device="cuda")[None] > qi, float("-inf"))
    want = torch.softmax(sc, -1) @ rv
    for name in VARIANTS:
        setv(name)
        o = fn().float()
        outs[name] = o.clone()
        errs[name] = ((o[0, -256:, 0].double() - want).norm() / want.norm()).item()
    diffs = {n: (outs[n] - outs["base"]).abs().max().item() for n in VARIANTS}
    times = {n: [] for n in VARIANTS}
    names = list(VARIANTS)
    for r in range(ROUNDS):
        for name in (names if r % 2 == 0 else names[::-1]):
            setv(name); fn()
            times[name].append(time_ms(fn))
    for name in names:
        ms = statistics.median(times[name])
        rows.append(dict(point=point, impl=name, ms=ms, ms_rounds=times[name], tflops=fl / ms / 1e9,
                         maxdiff_vs_base=diffs[name], rel_err_fp64=errs[name]))
        print(rows[-1], flush=True)
setv("base")
print("SUMMARY")
for point in POINTS:
    sel = {r["impl"]: r for r in rows if r["point"] == point}
    print(point, " ".join(f"{n}={sel[n]['tflops']:.0f}({sel[n]['tflops']/sel['base']['tflops']:.3f},err={sel[n]['rel_err_fp64']:.2e})" for n in sel))
json.dump(dict(device=device_facts(), date=time.strftime("%Y-%m-%d"), variants={n: {d: dataclasses.asdict(c) for d, c in v.items()} for n, v in VARIANTS.items()}, rows=rows, seconds=time.time() - t0),
          open(os.path.join(os.environ.get("OUT", "."), os.environ.get("NAME", "fp8-cfg-ab") + ".json"), "w"), indent=1)
