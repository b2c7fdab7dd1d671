"""flex fwd+bwd: tileattn vs torch.compile(flex_attention), B=4 H=32 D=128 bf16, causal and
document masks, N=4096 and 16384 (causal only at 16k). ms of forward+backward."""
import json, os, sys, torch, triton
sys.path.insert(0, "benchmarks")
import flex_mods
from torch.nn.attention.flex_attention import create_block_mask
from tileattn.flex import flex_attention
from tileattn.bench import flex_peer
dev = torch.device("cuda")
rows = []
compiled = flex_peer.compiled_flex_attention()
for case, N in (("causal", 4096), ("document", 4096), ("causal", 16384)):
    B, H, D = 4, 32, 128
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device=dev, generator=gen).bfloat16().requires_grad_() for _ in range(3))
    mask_mod, score_mod, mb = flex_mods.masks_and_mods(case, N, dev)
    bm = create_block_mask(mask_mod, mb, 1, N, N, device=dev)
    flops = flex_peer.mask_flops(mask_mod, B, H, D, N, N, dev) * 3.5   # fwd + bwd (2.5x)
    grad = torch.randn(B, H, N, D, device=dev, dtype=torch.bfloat16)
    for impl, fn in (("tileattn", flex_attention), ("flex", compiled)):
        def step():
            out = fn(q, k, v, block_mask=bm)
            torch.autograd.grad(out, (q, k, v), grad)
        step(); torch.cuda.synchronize()
        ms = triton.testing.do_bench(step, warmup=20, rep=200)
        rows.append(dict(case=case, N=N, impl=impl, ms=ms, tflops=flops / ms * 1e-9))
        print(case, N, impl, f"{ms:.3f} ms", f"{flops / ms * 1e-9:.1f} TFLOP/s (fwd+bwd)", flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "flex_bwd.json"), "w"), indent=1)
