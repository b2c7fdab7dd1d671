"""attention(window_size=(1024, 0), causal) bf16 B=4 H=32: the Hopper kernel (auto) against the
portable one (forced), TFLOP/s on the window's visible pairs. Prints JSON rows."""
import json, torch, triton, tileattn
rows = []
for d in (128, 256):
    for n in (4096, 16384):
        q, k, v = (torch.randn(4, n, 32, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        w = 1024
        pairs = sum(min(i, w) + 1 for i in range(n))
        flops = 4 * 4 * 32 * pairs * d
        for label, kernel in (("sm90", "auto"), ("portable", "portable")):
            with tileattn.use_kernels(attention=kernel):
                call = lambda: tileattn.attention(q, k, v, causal=True, window_size=(w, 0))
                call()
                ms = triton.testing.do_bench(call, warmup=50, rep=200, return_mode="median")
            rows.append(dict(D=d, N=n, impl=label, ms=ms, tflops=flops / ms / 1e9))
        print(d, n, " ".join(f"{r['impl']} {r['tflops']:.0f}" for r in rows[-2:]), flush=True)
print(json.dumps(rows))
