"""attention(softcap=30): the Hopper kernel (auto) against the portable one (forced), and no
softcap (auto), bf16 B=4 H=32, interleaved; TFLOP/s. Prints JSON rows."""
import json, torch, triton, tileattn
rows = []
for d in (128, 256):
    for n in (1024, 4096, 16384):
        for causal in (False, True):
            q, k, v = (torch.randn(4, n, 32, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            flops = 4 * 4 * 32 * n * n * d / (2 if causal else 1)
            for label, cap, kernel in (("sm90-softcap", 30.0, "auto"), ("portable-softcap", 30.0, "portable"),
                                       ("auto-nosoftcap", 0.0, "auto")):
                with tileattn.use_kernels(attention=kernel):
                    call = lambda: tileattn.attention(q, k, v, causal=causal, softcap=cap)
                    call()
                    ms = triton.testing.do_bench(call, warmup=50, rep=200, return_mode="median")
                rows.append(dict(D=d, N=n, causal=causal, impl=label, ms=ms, tflops=flops / ms / 1e9))
            print(" ".join(f"{r['impl']} {r['tflops']:.0f}" for r in rows[-3:]), d, n, causal, flush=True)
print(json.dumps(rows))
