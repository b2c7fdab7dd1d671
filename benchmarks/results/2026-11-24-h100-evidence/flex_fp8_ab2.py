"""flex FP8 (portable kernel) at N=16k, B=4 H=32 D=128, four masks: TFLOP/s of the current
kernels/attention/fwd_loops.py (run once per version, ABAB)."""
import json, os, sys
import torch, triton
import tileattn
from tileattn.flex import flex_attention
from torch.nn.attention.flex_attention import create_block_mask
from tileattn.bench.common import spin_up
B, H, N, D = 4, 32, 16384, 128
dev = torch.device("cuda")
gen = torch.Generator(device=dev).manual_seed(0)
raw = [torch.randn(B, H, N, D, device=dev, generator=gen) for _ in range(3)]
(q, qd), (k, kd), (v, vd) = (tileattn.quantize_fp8(x) for x in raw)
doc = torch.sort(torch.randint(0, 16, (N,), device=dev, generator=gen)).values
masks = {"causal": lambda b, h, qi, ki: qi >= ki,
         "prefix_lm": lambda b, h, qi, ki: (ki < 2048) | (qi >= ki),
         "window": lambda b, h, qi, ki: (qi >= ki) & (qi - ki <= 1024),
         "document": lambda b, h, qi, ki: (doc[qi] == doc[ki]) & (qi >= ki)}
spin_up()
res = {"version": sys.argv[1]}
for name, mm in masks.items():
    bm = create_block_mask(mm, None, None, N, N, device=dev)
    call = lambda: flex_attention(q, k, v, block_mask=bm, q_descale=qd, k_descale=kd, v_descale=vd)
    out = call()
    res[name] = triton.testing.do_bench(call, warmup=100, rep=400, return_mode="median")
    res[name + "_checksum"] = float(out.float().abs().mean())
print(json.dumps(res), flush=True)
