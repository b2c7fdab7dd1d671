"""Forward+backward at short contexts on the GPU: the custom op's registered autograd
(library.attention) vs eager autograd (tileattn.attention -> ops/backward.EagerAttention),
same process. Host us per step (200 steps, no sync) and do_bench ms."""
import time, torch, triton, tileattn
from tileattn.ops import library
dev = "cuda"
for N, causal in ((1024, False), (1024, True), (2048, True)):
    B, H, D = 4, 32, 128
    q, k, v = (torch.randn(B, N, H, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn(B, N, H, D, device=dev, dtype=torch.bfloat16)
    def via_op():
        out, _ = library.attention(q, k, v, causal, D ** -0.5, -1, -1, 0.0, None, None, None, None, None, False)
        return torch.autograd.grad(out, (q, k, v), g)
    def eager():
        out = tileattn.attention(q, k, v, causal=causal)
        return torch.autograd.grad(out, (q, k, v), g)
    res = {}
    for rnd in range(2):
        for name, fn in (("op", via_op), ("eager", eager)):
            fn(); torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(200):
                fn()
            host = (time.perf_counter() - t) / 200 * 1e6
            torch.cuda.synchronize()
            ms = triton.testing.do_bench(fn, warmup=25, rep=200)
            res.setdefault(name, []).append((round(host), round(ms, 4)))
    print(f"N={N} causal={causal}: " + "  ".join(f"{k}: {v}" for k, v in res.items()), flush=True)
