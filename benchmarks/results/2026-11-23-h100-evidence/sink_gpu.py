"""Kernel's own error (same quantized inputs vs fp64) on fp8_scales' sink inputs, D=128 N=1024,
with the P offset (8) and without (0): issue 19's P-in-range bar."""
import json, torch, tileattn
from tileattn.bench import fp8_scales
from tileattn.kernels.attention import fwd
from tileattn.ops import attention as attention_op
from tileattn.reference import attention_reference
rows = []
for offset in (8.0, 0.0):
    fwd.FP8_P_OFFSET = offset
    attention_op._CALLS._entries.clear()   # cached launches hold the old offset
    for kind in ("sink", "plain"):
        for seed in (0, 1, 2):
            q, k, v = fp8_scales.make_inputs(kind, 2, 1024, 8, 128, seed, "cuda")
            q8, k8, v8, scales = tileattn.quantize_qkv_fp8(q, k, v)
            out = tileattn.attention(q8, k8, v8, causal=True, **scales)
            ref, _ = attention_reference(q8, k8, v8, causal=True, **scales)
            rows.append(dict(p_offset=offset, kind=kind, seed=seed,
                             rel_vs_quantized=float((out.double() - ref).norm() / ref.norm())))
            print(rows[-1], flush=True)
print(json.dumps(rows))
