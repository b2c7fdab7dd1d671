"""D=64 long-call rows: 192x128 (3 consumers, today's) vs 256x64 (4 consumers, 120 registers)
vs 192x64, interleaved; errors vs fp64 on an odd shape per variant."""
import json, os, time, statistics
import torch, tileattn
from tileattn.ops import call_cache
from tileattn.kernels.attention import sm90
from tileattn.bench.common import spin_up, time_ms, device_facts

C = sm90.Sm90Config
VARS = {"192x128s3": C(128, 3, block_m=192, split=True), "256x64s3": C(64, 3, block_m=256, split=True),
        "256x64s4": C(64, 4, block_m=256, split=True), "192x64s3": C(64, 3, block_m=192, split=True)}
def setv(name):
    sm90.LONG_QUERY_CONFIGS[64] = VARS[name]; call_cache.clear_all()

def ref(q, k, v, causal):
    qd, kd, vd = (x.double().transpose(1, 2) for x in (q, k, v))
    s = qd @ kd.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        n, m = s.shape[-2:]
        s = s.masked_fill(torch.ones(n, m, dtype=torch.bool, device=s.device).tril(m - n).logical_not(), float("-inf"))
    return (s.softmax(-1) @ vd).transpose(1, 2)
g = torch.Generator(device="cuda").manual_seed(3)
checks = []
for causal in (False, True):
    q, k, v = (torch.randn(1, 4100, 3, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    want = ref(q, k, v, causal)
    for name in VARS:
        setv(name)
        out, lse = tileattn.attention(q, k, v, causal=causal, return_lse=True)
        checks.append(dict(variant=name, causal=causal, err=float((out.double() - want).norm() / want.norm())))
        print(checks[-1], flush=True)
rows = []
spin_up()
for N in (4096, 16384):
    for causal in (False, True):
        B = 4
        q, k, v = (torch.randn(B, N, 32, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        fn = lambda: tileattn.attention(q, k, v, causal=causal)
        fl = 4 * B * 32 * N * N * 64 / (2 if causal else 1)
        names = list(VARS)
        times = {n: [] for n in names}
        for r in range(4):
            for name in names[r % len(names):] + names[:r % len(names)]:
                setv(name); fn(); times[name].append(time_ms(fn))
        tf = {n: fl / statistics.median(t) / 1e9 for n, t in times.items()}
        rows.append(dict(N=N, causal=causal, times=times, tflops=tf))
        print(N, causal, {n: round(x, 1) for n, x in tf.items()}, flush=True)
json.dump(dict(device=device_facts(), date=time.strftime("%Y-%m-%d"), checks=checks, rows=rows),
          open(os.path.join(os.environ.get("OUT", "."), "d64-consumers-ab.json"), "w"), indent=1)
