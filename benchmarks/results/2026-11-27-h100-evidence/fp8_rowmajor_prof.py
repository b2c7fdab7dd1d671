"""Where a small FP8 call with a row-major V spends its time: host time a call (200 calls
back to back, then one sync) and the GPU kernels of one call (torch.profiler), for the Hopper
and the portable kernel, V row-major vs K-major."""
import time, torch
import tileattn
from torch.profiler import profile, ProfilerActivity

for (b, h, n, d, causal) in [(1, 32, 256, 128, True), (1, 32, 1024, 256, False), (4, 32, 1024, 128, True)]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, n, h, d, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(3))
    for k_major in (False, True):
        q8, k8, v8, scales = tileattn.quantize_qkv_fp8(q, k, v, v_k_major=k_major)
        for force in ("sm90", "portable"):
            with tileattn.use_kernels(attention=force):
                for _ in range(20):
                    tileattn.attention(q8, k8, v8, causal=causal, **scales)
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(200):
                    tileattn.attention(q8, k8, v8, causal=causal, **scales)
                host = (time.perf_counter() - t) / 200
                torch.cuda.synchronize()
                wall = (time.perf_counter() - t) / 200
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(10):
                        tileattn.attention(q8, k8, v8, causal=causal, **scales)
                    torch.cuda.synchronize()
                kernels = {}
                for e in prof.key_averages():
                    if e.device_type.name == "CUDA" if hasattr(e, "device_type") else True:
                        kernels[e.key[:60]] = (e.count, getattr(e, "device_time", getattr(e, "cuda_time", 0)))
                print(f"B={b} H={h} N={n} D={d} causal={causal} V {'K-major' if k_major else 'row-major'} {force}: host {host*1e6:.1f} us/call, wall {wall*1e6:.1f} us/call; kernels {kernels}", flush=True)
