"""Per-kernel GPU times (torch.profiler) of mla_decode at small batches, where the eager time is
mostly host overhead: python benchmarks/mla_kernel_times.py (shapes in SHAPES below)."""
import torch
import tileattn
from torch.profiler import profile, ProfilerActivity
from tileattn.bench.mla import _make_cache
dev = torch.device("cuda"); gen = torch.Generator(device=dev).manual_seed(0)
SHAPES = ((1, 16), (1, 64), (32, 16))
for batch, heads in SHAPES:
    kv, pt, ds = _make_cache(batch, 8192, 64, "bf16", dev, gen)
    q = torch.randn(batch, 1, heads, 576, device=dev, generator=gen, dtype=torch.bfloat16)
    sl = torch.full((batch,), 8192, dtype=torch.int32, device=dev)
    plan = tileattn.mla_plan(sl, num_heads=heads, page_size=64, kv_dtype=kv.dtype, device=dev)
    f = lambda: tileattn.mla_decode(q, kv, pt, sl, softmax_scale=0.07, plan=plan)
    for _ in range(5): f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(10): f()
        torch.cuda.synchronize()
    print(batch, heads, "work", plan.num_work)
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=6))
