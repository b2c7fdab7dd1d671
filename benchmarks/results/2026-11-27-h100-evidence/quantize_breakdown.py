"""quantize_qkv_fp8 timing breakdown (B=4, N=16k, H=32, D=128 bf16) and attention on its outputs."""
import json, os, torch
import tileattn
from tileattn.bench.common import device_facts, spin_up, time_ms
B, N, H, D = 4, 16384, 32, 128
q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
spin_up()
rows = []
variants = {"tensor": dict(per="tensor"), "head": dict(per="head"), "block": dict(per="block"),
            "block+smooth": dict(per="block", smooth_k=True), "block+rotate": dict(per="block", rotate=True),
            "block+smooth+rotate": dict(per="block", smooth_k=True, rotate=True)}
for name, kw in variants.items():
    quant_ms = time_ms(lambda: tileattn.quantize_qkv_fp8(q, k, v, **kw))
    q8, k8, v8, scales = tileattn.quantize_qkv_fp8(q, k, v, **kw)
    att = {c: time_ms(lambda: tileattn.attention(q8, k8, v8, causal=c, **scales)) for c in (False, True)}
    print(name, f"quantize {quant_ms:.3f} ms, attention {att[False]:.3f} / causal {att[True]:.3f} ms", flush=True)
    rows.append(dict(variant=name, quantize_ms=quant_ms, attention_ms=att[False], attention_causal_ms=att[True]))
# per-tensor path as the cost bar times it: quantize per tensor (V row-major) + attention
q8, k8, v8, scales = tileattn.quantize_qkv_fp8(q, k, v, per="tensor", v_k_major=False)
for c in (False, True):
    print("tensor V row-major attention", c, f"{time_ms(lambda: tileattn.attention(q8, k8, v8, causal=c, **scales)):.3f}", flush=True)
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(5):
        tileattn.quantize_qkv_fp8(q, k, v, per="block", smooth_k=True, rotate=True)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
json.dump(dict(device_facts(), rows=rows), open(os.path.join(os.environ.get("OUT", "."), "quantize-breakdown.json"), "w"), indent=1)
