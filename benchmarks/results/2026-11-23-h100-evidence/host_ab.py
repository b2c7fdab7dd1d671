"""Host microseconds per eager attention() call at N=1024 (B=4, H=32, D=128): the tileattn on
PYTHONPATH (the checkout, or .ab/old: 061fe6f, the commit before the custom ops). Prints JSON."""
import json, sys, time
import torch, triton
import tileattn

def host_us(call, n=500):
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    best = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(n):
            call()
        best.append((time.perf_counter() - start) / n * 1e6)
        torch.cuda.synchronize()
    return min(best)

rows = []
for dtype in (torch.bfloat16, torch.float8_e4m3fn):
    for causal in (False, True):
        for N, label in ((1024, "N1024"), (128, "N128")):
            q, k, v = (torch.randn(4, N, 32, 128, device="cuda") for _ in range(3))
            kw = {}
            if dtype.itemsize == 1:
                (q, qd), (k, kd), (v, vd) = (tileattn.quantize_fp8(x, dtype) for x in (q, k, v))
                kw = dict(q_descale=qd, k_descale=kd, v_descale=vd)
            else:
                q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
            call = lambda: tileattn.attention(q, k, v, causal=causal, **kw)
            us = host_us(call)
            ms = triton.testing.do_bench(call, warmup=50, rep=200, return_mode="median")
            rows.append(dict(dtype=str(dtype), causal=causal, N=N, host_us=us, eager_ms=ms))
print(json.dumps(dict(tileattn=tileattn.__file__, rows=rows)))
