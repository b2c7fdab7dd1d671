import cProfile, pstats, io, time, sys, torch
sys.path.insert(0, "benchmarks")
from torch.nn.attention.flex_attention import create_block_mask
from tileattn.bench import flex_peer
from tileattn.flex import flex_attention, mask_bits
real = mask_bits.applies
n = 1024
gen = torch.Generator().manual_seed(n)
cuts = torch.stack([torch.randperm(n - 1, generator=gen)[:3].sort().values + 1 for _ in range(4)])
doc = torch.stack([torch.searchsorted(c, torch.arange(n), right=True) for c in cuts]).to(torch.int32).cuda()
bm = create_block_mask(flex_peer.document_causal(doc), 4, 1, n, n, device="cuda")
q, k, v = (torch.randn(4, 32, n, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for bits in (False, True, False, True):
    mask_bits.applies = real if bits else (lambda *a: False)
    for _ in range(20): flex_attention(q, k, v, block_mask=bm)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(100): flex_attention(q, k, v, block_mask=bm)
    host = (time.perf_counter() - t) / 100 * 1e6
    torch.cuda.synchronize()
    print("bits" if bits else "hook", f"host {host:.0f} us a call, with sync {(time.perf_counter() - t) / 100 * 1e6:.0f}", flush=True)
mask_bits.applies = real
pr = cProfile.Profile(); pr.enable()
for _ in range(200): flex_attention(q, k, v, block_mask=bm)
pr.disable(); torch.cuda.synchronize()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18); print(s.getvalue()[:5000])
