"""Interleaved A/B: old sm90 forward (HEAD, fp32 P carried) vs current working tree, FP8 (and optional bf16)
through attention(); cuDNN FP8 not included (same for both). Variants via VARIANTS env: old,new,new256..."""
import json, os, sys, time, dataclasses, collections
import torch
import tileattn
from tileattn.ops import call_cache
from tileattn.kernels.attention import sm90, _ab_old_sm90 as old
from tileattn.bench.common import spin_up, time_interleaved, device_facts

B, H = 4, 32
new_launch = sm90.attention_sm90_launch
TABLES = (sm90.FP8_CONFIGS, sm90.CONFIGS, sm90.LONG_QUERY_CONFIGS, sm90.SHORT_QUERY_CONFIGS)
BASES = [dict(t) for t in TABLES]
def setv(name):
    for t, b in zip(TABLES, BASES):
        t.clear(); t.update(b)
    sm90.attention_sm90_launch = old.attention_sm90_launch if name == "old" else new_launch
    extra = os.environ.get("EXTRA_" + name, "row_sum_mma=True" if name == "rs" else "")
    if extra:   # e.g. EXTRA_rs="row_sum_mma=True"
        kw = dict((k, eval(v)) for k, v in (x.split("=") for x in extra.split(",")))
        for table in TABLES:
            for d in table:
                table[d] = dataclasses.replace(table[d], **kw)
    call_cache.clear_all()

# D:N:causal:v(grp|nat|bf16):softcap:variants(+)
POINTS = [(int(a), int(b), c == "1", d, float(e), tuple(f.split("+"))) for a, b, c, d, e, f in
          (x.split(":") for x in os.environ.get("POINTS", "128:4096:0:grp:0:old+new+rs 128:16384:0:grp:0:old+new+rs").split())]
ROUNDS = int(os.environ.get("ROUNDS", 3))

def flops(n, d, causal):
    f = 4 * B * H * n * n * d
    return f / 2 if causal else f

inputs = {}
def get(point):
    d, n, causal, vkind = point[:4]
    point = point[:4]
    if point not in inputs:
        g = torch.Generator(device="cuda").manual_seed(n + d)
        q, k, v = (torch.randn(B, n, H, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        if vkind == "bf16":
            inputs[point] = ((q, k, v), {})
        else:
            (q8, qd), (k8, kd), (v8, vd) = (tileattn.quantize_fp8(x, torch.float8_e4m3fn) for x in (q, k, v))
            if vkind == "nat":
                v8 = tileattn.prepare_v(v8)
            inputs[point] = ((q8, k8, v8), dict(q_descale=qd, k_descale=kd, v_descale=vd))
    return inputs[point]

spin_up()
rows = []
t0 = time.time()
for point in POINTS:
    d, n, causal, vkind, softcap, VARIANTS = point
    args, kw = get(point)
    if softcap:
        kw = dict(kw, softcap=softcap)
    err = {}
    outs = {}
    calls = {}
    for name in VARIANTS:
        setv(name)
        outs[name] = tileattn.attention(*args, causal=causal, **kw).float()
    ref = outs[VARIANTS[0]]
    if n <= 4096:   # error against fp32 math on the same (dequantized) inputs
        q, k, v = (x.float() for x in args)
        if vkind != "bf16":
            q, k = q * kw["q_descale"], k * kw["k_descale"]
            v = v * kw["v_descale"]
        if vkind == "nat":
            v = v.transpose(1, 3).transpose(2, 3) if False else None
        if v is not None:
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            scale = d ** -0.5
            r = torch.empty_like(qt)
            for h in range(0, qt.shape[1], 4):
                sc = (qt[:, h:h+4] @ kt[:, h:h+4].transpose(-1, -2)) * scale
                if softcap:
                    sc = softcap * torch.tanh(sc / softcap)
                if causal:
                    sc = sc.masked_fill(torch.ones(n, n, dtype=torch.bool, device=sc.device).triu(1), float("-inf"))
                r[:, h:h+4] = torch.softmax(sc, -1) @ vt[:, h:h+4]
            r = r.transpose(1, 2)
            for name in VARIANTS:
                err[name] = ((outs[name] - r).norm() / r.norm()).item()
    # time: each variant's call sets its config first (cache cleared on switch)
    for name in VARIANTS:
        def make(name):
            def fn():
                return tileattn.attention(*args, causal=causal, **kw)
            return fn
        calls[name] = make(name)
    times = {name: [] for name in VARIANTS}
    from tileattn.bench.common import time_ms
    for r in range(ROUNDS):
        for name in (VARIANTS if r % 2 == 0 else VARIANTS[::-1]):
            setv(name); calls[name]()
            times[name].append(time_ms(calls[name]))
    for name in VARIANTS:
        ms = sorted(times[name])[len(times[name]) // 2]
        diff = (outs[name] - ref).abs().max().item()
        rows.append(dict(D=d, N=n, causal=causal, v=vkind, impl=name, ms=ms, ms_rounds=times[name],
                         softcap=softcap, tflops=flops(n, d, causal) / ms / 1e9, maxdiff_vs_first=diff,
                         rel_l2_vs_fp32=err.get(name)))
        print(rows[-1], flush=True)
setv("new")
print("SUMMARY")
for point in POINTS:
    d, n, causal, vkind, softcap, _ = point
    sel = [r for r in rows if (r["D"], r["N"], r["causal"], r["v"], r["softcap"]) == point[:5]]
    base_t = sel[0]["tflops"]
    print(point[:5], " ".join(f"{r['impl']}={r['tflops']:.0f}({r['tflops']/base_t:.3f}) err={r['rel_l2_vs_fp32']}" for r in sel))
out = os.environ.get("OUT", ".")
json.dump(dict(device=device_facts(), date=time.strftime("%Y-%m-%d"), rows=rows, seconds=time.time() - t0),
          open(os.path.join(out, os.environ.get("NAME", "fp8-pack-ab") + ".json"), "w"), indent=1)
