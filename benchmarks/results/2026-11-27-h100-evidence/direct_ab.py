"""Host time and eager time of short calls with BoundLaunch's direct C-launcher path on/off."""
import json, os, time, collections
import torch, tileattn
from tileattn.kernels import runtime
from tileattn.ops import call_cache
from tileattn.bench.common import spin_up, time_ms, device_facts
B, H = 4, 32
create = runtime.DirectLaunch.create
def setv(on):
    runtime.DirectLaunch.create = staticmethod(create) if on else staticmethod(lambda *a: None)
    call_cache.clear_all()

def inputs(d, n, dt):
    x = [torch.randn(B, n, H, d, device="cuda") for _ in range(3)]
    if dt == "bf16":
        return [t.bfloat16() for t in x], {}
    (q, qd), (k, kd), (v, vd) = (tileattn.quantize_fp8(t) for t in x)
    return [q, k, tileattn.prepare_v(v)], dict(q_descale=qd, k_descale=kd, v_descale=vd)

POINTS = [(64, 1024, True, "bf16"), (64, 1024, False, "bf16"), (128, 1024, True, "bf16"),
          (128, 1024, False, "bf16"), (128, 1024, True, "fp8"), (64, 2048, True, "bf16")]
data = {p: inputs(p[0], p[1], p[3]) for p in POINTS}
spin_up()
rows = []
for r in range(3):
    for p in POINTS:
        d, n, c, dt = p
        (q, k, v), kw = data[p]
        for on in ((True, False) if r % 2 == 0 else (False, True)):
            setv(on)
            fn = lambda: tileattn.attention(q, k, v, causal=c, **kw)
            ref = fn().float()
            for _ in range(20): fn()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(300): fn()
            host = (time.perf_counter() - t) / 300 * 1e6
            torch.cuda.synchronize()
            ms = time_ms(fn)
            f = 4 * B * H * n * n * d / (2 if c else 1)
            rows.append(dict(round=r, D=d, N=n, causal=c, dtype=dt, direct=on, host_us=host, ms=ms, tflops=f / ms / 1e9))
            print(rows[-1], flush=True)
    # training step at N=1024 D=128 causal: fwd+bwd through autograd (bound backward launches)
    for on in (True, False):
        setv(on)
        q, k, v = (torch.randn(B, 1024, H, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        do = torch.randn(B, 1024, H, 128, device="cuda", dtype=torch.bfloat16)
        def step():
            out = tileattn.attention(q, k, v, causal=True)
            torch.autograd.grad(out, (q, k, v), do)
        ms = time_ms(step)
        rows.append(dict(round=r, case="fwd+bwd D128 causal 1k", direct=on, ms=ms))
        print(rows[-1], flush=True)
setv(True)
agg = collections.defaultdict(list)
for x in rows:
    key = (x.get("case") or (x["D"], x["N"], x["causal"], x["dtype"]), x["direct"])
    agg[key].append((round(x.get("host_us", 0), 1), round(x.get("tflops", 0)), round(x["ms"] * 1000, 1)))
print("SUMMARY (host us, TFLOP/s, us) per round")
for k_, v_ in agg.items(): print(k_, v_)
json.dump(dict(device=device_facts(), rows=rows), open(os.path.join(os.environ.get("OUT", "."), "direct-launch-ab.json"), "w"), indent=1)
