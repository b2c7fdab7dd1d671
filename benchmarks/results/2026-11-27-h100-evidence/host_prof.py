import cProfile, pstats, time, torch, tileattn, io
from tileattn.bench.common import spin_up
B, H = 4, 32
q, k, v = (torch.randn(B, 1024, H, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
fn = lambda: tileattn.attention(q, k, v, causal=True)
for _ in range(50): fn()
torch.cuda.synchronize()
for rep in range(3):
    t = time.perf_counter()
    for _ in range(1000): fn()
    host = (time.perf_counter() - t) / 1000 * 1e6
    torch.cuda.synchronize()
    tot = (time.perf_counter() - t) / 1000 * 1e6
    print(f"host {host:.1f} us/call, with sync {tot:.1f} us/call")
# pure torch empty + a trivial triton-free op for reference
t = time.perf_counter()
for _ in range(1000): torch.empty_like(q)
print("empty_like", (time.perf_counter() - t))
pr = cProfile.Profile()
pr.enable()
for _ in range(2000): fn()
pr.disable()
torch.cuda.synchronize()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(35)
print(s.getvalue()[:9000])
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(40)
print(s.getvalue()[:9000])
