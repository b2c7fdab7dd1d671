"""Per-kernel GPU times (torch.profiler) of mla_decode at small batches, where the eager time is
mostly host overhead: python benchmarks/mla_kernel_times.py [batch:heads[:fp8][:seq] ...]
(default: the shapes in SHAPES below; seq defaults to 8192)."""
import sys
import torch
import tileattn
from torch.profiler import profile, ProfilerActivity
from tileattn.bench.mla import _make_cache
dev = torch.device("cuda"); gen = torch.Generator(device=dev).manual_seed(0)
SHAPES = [a.split(":") for a in sys.argv[1:]] or [("1", "16"), ("1", "64"), ("32", "16")]
for shape in SHAPES:
    batch, heads = int(shape[0]), int(shape[1])
    kv_dtype = "fp8" if "fp8" in shape else "bf16"
    seq = int(shape[-1]) if len(shape) > 2 and shape[-1].isdigit() else 8192
    kv, pt, ds = _make_cache(batch, seq, 64, kv_dtype, dev, gen)
    q = torch.randn(batch, 1, heads, 576, device=dev, generator=gen, dtype=torch.bfloat16)
    sl = torch.full((batch,), seq, dtype=torch.int32, device=dev)
    plan = tileattn.mla_plan(sl, num_heads=heads, page_size=64, kv_dtype=kv.dtype, device=dev)
    f = lambda: tileattn.mla_decode(q, kv, pt, sl, softmax_scale=0.07, plan=plan, kv_descale=ds)
    for _ in range(5): f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(10): f()
        torch.cuda.synchronize()
    print(batch, heads, kv_dtype, seq, "work", plan.num_work, "kernel", tileattn.api.mla_kernel_for(tileattn.api.arch_of(dev), q, kv, plan))
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=6))
