"""A/B: sm90.SHADOW_IDLE (a ping-pong warpgroup whose rows of a tile lie past the sequence end
shadows it; dense work lists weigh the last query block by its warpgroups with rows) vs off.
Correctness first (fp64, odd lengths, both variants), then interleaved rounds."""
import json, os, time, statistics
import torch, tileattn
from tileattn.ops import call_cache
from tileattn.kernels.attention import sm90
from tileattn.bench.common import spin_up, time_ms, device_facts

def setv(name):
    sm90.SHADOW_IDLE = name == "shadow"; call_cache.clear_all()

def ref(q, k, v, causal):
    qd, kd, vd = (x.double().transpose(1, 2) for x in (q, k, v))
    s = qd @ kd.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        n, m = s.shape[-2:]
        s = s.masked_fill(torch.ones(n, m, dtype=torch.bool, device=s.device).tril(m - n).logical_not(), float("-inf"))
    return (s.softmax(-1) @ vd).transpose(1, 2)

checks = []
g = torch.Generator(device="cuda").manual_seed(3)
for (B, H, N, D) in [(1, 3, 4100, 64), (2, 2, 4161, 64), (1, 2, 8200, 64), (2, 3, 1000, 128), (1, 2, 4097, 64), (1, 2, 200, 128), (1, 2, 70, 64)]:
    for causal in (False, True):
        q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        want = ref(q, k, v, causal)
        res = {}
        for name in ("base", "shadow"):
            setv(name)
            out, lse = tileattn.attention(q, k, v, causal=causal, return_lse=True)
            res[name] = (out.float(), lse)
        err = {n: float((o.double() - want).norm() / want.norm()) for n, (o, _) in res.items()}
        same = bool(torch.equal(res["base"][0], res["shadow"][0]) and torch.equal(res["base"][1], res["shadow"][1]))
        checks.append(dict(B=B, H=H, N=N, D=D, causal=causal, err=err, bit_equal=same))
        print(checks[-1], flush=True)
# varlen (128-row tiles, many last blocks with one warpgroup of rows)
lens = [130, 64, 1, 700, 4100, 129, 3000, 65]
cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
qv, kv, vv = (torch.randn(int(cu[-1]), 4, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
for causal in (False, True):
    outs = {}
    for name in ("base", "shadow"):
        setv(name); outs[name] = tileattn.attention_varlen(qv, kv, vv, cu, cu, max(lens), max(lens), causal=causal).float()
    errs = []
    for b, n in enumerate(lens):
        s0 = int(cu[b]); w = ref(qv[s0:s0+n][None], kv[s0:s0+n][None], vv[s0:s0+n][None], causal)[0]
        errs.append({nm: float((o[s0:s0+n].double() - w).norm() / w.norm()) for nm, o in outs.items()})
    checks.append(dict(case="varlen", causal=causal, err=errs, bit_equal=bool(torch.equal(outs["base"], outs["shadow"]))))
    print(checks[-1], flush=True)

rows = []
spin_up()
cases = []
for D, N in [(64, 4096), (64, 16384), (64, 8192), (64, 4160)]:
    for causal in (False, True):
        cases.append((D, N, causal))
glens = torch.randint(128, 4097, (24,), generator=torch.Generator().manual_seed(5)).tolist()
gcu = torch.tensor([0] + torch.tensor(glens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
for D, N, causal in cases:
    if D == "varlen":
        q, k, v = (torch.randn(int(gcu[-1]), 32, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        fn = lambda: tileattn.attention_varlen(q, k, v, gcu, gcu, max(glens), max(glens), causal=True)
        fl = sum(4 * 32 * 128 * n * (n + 1) / 2 for n in glens)
    else:
        B = 4 if N >= 4096 else 16
        q, k, v = (torch.randn(B, N, 32, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        fn = lambda: tileattn.attention(q, k, v, causal=causal)
        fl = 4 * B * 32 * N * N * D / (2 if causal else 1)
    times = {"base": [], "shadow": []}
    for r in range(6):
        for name in (("base", "shadow") if r % 2 == 0 else ("shadow", "base")):
            setv(name); fn(); times[name].append(time_ms(fn))
    tf = {n: fl / statistics.median(t) / 1e9 for n, t in times.items()}
    rows.append(dict(D=D, N=N, causal=causal, times=times, tflops=tf, ratio=tf["shadow"] / tf["base"]))
    print(D, N, causal, {n: round(x, 1) for n, x in tf.items()}, "ratio %.3f" % rows[-1]["ratio"], flush=True)
    del q, k, v
json.dump(dict(device=device_facts(), date=time.strftime("%Y-%m-%d"), checks=checks, rows=rows),
          open(os.path.join(os.environ.get("OUT", "."), "shadow-ab.json"), "w"), indent=1)
