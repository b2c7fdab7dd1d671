"""A/B: flex FP8 (portable kernel) causal / prefix-LM at N=16k, B=4 H=32 D=128: head-grouped
longest-first order and the causal config row, against the current launch and dense FP8."""
import json, os, sys
import torch, triton
import tileattn
from tileattn.flex import flex_attention
from tileattn.kernels.attention import fwd
from tileattn.ops import flex as flex_ops
from torch.nn.attention.flex_attention import create_block_mask
from tileattn.bench.common import spin_up

B, H, N, D = 4, 32, 16384, 128
dev = torch.device("cuda")
gen = torch.Generator(device=dev).manual_seed(0)
raw = [torch.randn(B, H, N, D, device=dev, generator=gen) for _ in range(3)]
(q, qd), (k, kd), (v, vd) = (tileattn.quantize_fp8(x) for x in raw)
masks = {"causal": lambda b, h, qi, ki: qi >= ki,
         "prefix_lm": lambda b, h, qi, ki: (ki < 2048) | (qi >= ki)}
orig_hpg, orig_cfg = fwd.heads_per_group, fwd.config_for
def set_variant(grouped, causal_cfg):
    fwd.heads_per_group = (lambda c, *a: orig_hpg(True, *a)) if grouped else orig_hpg
    fwd.config_for = ((lambda arch, d, dv, f8, causal=False: orig_cfg(arch, d, dv, f8, True))
                      if causal_cfg else orig_cfg)
rows = []
spin_up()
for name, mm in masks.items():
    bm = create_block_mask(mm, None, None, N, N, device=dev)
    dense_pairs = (N * (N + 1) / 2 if name == "causal"
                   else 2048 * 2048 + N * (N + 1) / 2 - 2048 * 2049 / 2)
    flops = 4 * B * H * D * dense_pairs
    ref = None
    for label, grouped, ccfg in (("base", 0, 0), ("grouped", 1, 0), ("causal_cfg", 0, 1),
                                 ("grouped+causal_cfg", 1, 1), ("base-again", 0, 0)):
        set_variant(grouped, ccfg)
        call = lambda: flex_attention(q, k, v, block_mask=bm, q_descale=qd, k_descale=kd, v_descale=vd)
        out = call().float()
        if ref is None:
            ref = out
        diff = float((out - ref).norm() / ref.norm())
        ms = triton.testing.do_bench(call, warmup=100, rep=400, return_mode="median")
        rows.append(dict(mask=name, variant=label, ms=ms, tflops=flops / ms / 1e9, diff=diff))
        print(json.dumps(rows[-1]), flush=True)
    set_variant(0, 0)
    import math
    from tileattn.bench import flex_peer
    compiled = flex_peer.compiled_flex_attention()
    scale = 1.0 / math.sqrt(D)
    call = lambda: compiled(q, k, v, block_mask=bm, scale=scale * float(qd) * float(kd)).float() * float(vd)
    out = call()
    ms = triton.testing.do_bench(call, warmup=100, rep=400, return_mode="median")
    rows.append(dict(mask=name, variant="flex (torch.compile) fp8", ms=ms, tflops=flops / ms / 1e9,
                     diff=float((out - ref).norm() / ref.norm())))
    print(json.dumps(rows[-1]), flush=True)
    if name == "causal":
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        call = lambda: tileattn.attention(qt, kt, vt, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
        ms = triton.testing.do_bench(call, warmup=100, rep=400, return_mode="median")
        rows.append(dict(mask=name, variant="dense attention()", ms=ms, tflops=flops / ms / 1e9))
        print(json.dumps(rows[-1]), flush=True)
with open(os.path.join(os.environ.get("OUT", "."), "flex-fp8-ab.json"), "w") as f:
    json.dump(rows, f, indent=1)
