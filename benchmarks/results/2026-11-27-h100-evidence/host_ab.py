"""Host µs a call and eager time of short calls, for the checkout on PYTHONPATH (one variant a process)."""
import json, sys, time, statistics, torch, tileattn
from tileattn.bench.common import spin_up, time_ms
B, H = 4, 32
label = sys.argv[1]
pts = [(64, 1024, True, "fwd"), (128, 1024, False, "fwd"), (128, 1024, True, "fwdbwd"), (64, 1024, True, "varlen")]
spin_up(1.0)
out = {}
for d, n, c, kind in pts:
    if kind == "varlen":
        q, k, v = (torch.randn(8 * 512, H, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        cu = torch.arange(0, 8 * 512 + 1, 512, dtype=torch.int32, device="cuda")
        fn = lambda: tileattn.attention_varlen(q, k, v, cu, cu, 512, 512, causal=c)
    else:
        g = kind == "fwdbwd"
        q, k, v = (torch.randn(B, n, H, d, device="cuda", dtype=torch.bfloat16, requires_grad=g) for _ in range(3))
        if g:
            do = torch.randn_like(q)
            def fn():
                o = tileattn.attention(q, k, v, causal=c)
                torch.autograd.grad(o, (q, k, v), do)
        else:
            fn = lambda: tileattn.attention(q, k, v, causal=c)
    for _ in range(30): fn()
    torch.cuda.synchronize()
    hosts = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(200): fn()
        hosts.append((time.perf_counter() - t) / 200 * 1e6)
        torch.cuda.synchronize()
    out[f"{kind} D{d} N{n} {'causal' if c else 'full'}"] = dict(host_us=statistics.median(hosts), eager_us=time_ms(fn) * 1000)
print("RESULT", json.dumps(dict(label=label, points=out)), flush=True)
