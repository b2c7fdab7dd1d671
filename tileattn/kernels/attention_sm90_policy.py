"""Where attention() takes the Hopper Gluon kernel (attention_sm90.py holds the kernel, its config
table and its launcher): supports() says whether the kernel handles a call's already validated
inputs (dtype, head dims, V layout, TMA-addressable strides), preferred() where it measured
faster than the portable kernel. api.kernel_for asks both.
"""

from __future__ import annotations

import torch

from ..arch import FP8_DTYPES
from .gluon_common import GL_DTYPES, tma_ready


def supports(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> bool:
    """Whether attention_sm90_launch handles these (already validated) inputs."""
    # Every head-dim pair attention() accepts (64, 96, 128, 192, 256; Dv may differ from D) has
    # a config row (config_for): tiles pad 96 and 192 to powers of two.
    if q.dtype not in GL_DTYPES:
        return False
    v_k_major = v.stride(1) == 1 and v.stride(3) != 1
    if (q.dtype in FP8_DTYPES) != v_k_major:
        return False  # 16-bit K-major V compiles but has not run on a GPU yet
    if not (tma_ready(q, (0, 1, 2)) and tma_ready(k, (0, 1, 2))):
        return False
    return tma_ready(v, (0, 2, 3) if v_k_major else (0, 1, 2))


# Smallest batch·q_heads·seqlen_q·seqlen_k·head_dim (halved under a causal mask) for which
# attention() takes this kernel. H100, B=4 H=32, eager attention() calls with the call cache
# (results/2026-11-22-h100-session5/dispatch-ab.json, TFLOP/s Hopper vs portable): at 2^34,
# D=128 N=1024 490 vs 419, D=128 N=2048 causal 479 vs 389, D=256 N=1024 causal 379 vs 307; at
# 2^33 (D=128 N=1024 causal) 188 vs 303: the kernel lasts ~0.07 ms, less than its host launch.
# (Before the call cache took this kernel, D=128 N=1024 measured 216: Triton's binder.)
MIN_WORK = 1 << 34


def preferred(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> bool:
    """Where this kernel measured faster than the portable one on H100 (benchmarks/NOTES.md,
    "Where the sm90 kernel should run", session 5): 16-bit at D 128 or 256, causal or not
    (causal since its tiles are scheduled in L2-sized head groups: D=128 N=16k 600 vs 483
    TFLOP/s), from MIN_WORK up, with Dv = D. It loses at D=64 (334 vs 348 at N=1024) and for
    FP8 (D=128 N=16k 664 vs 776: the portable kernel's FP8 is faster). Padded head dims (96,
    192) and Dv != D have not been timed: they run here only under TILEATTN_KERNEL=sm90."""
    batch, seqlen_q, num_q_heads, head_dim = q.shape
    work = batch * num_q_heads * seqlen_q * k.shape[1] * head_dim // (2 if causal else 1)
    return (q.dtype in (torch.float16, torch.bfloat16) and head_dim in (128, 256)
            and v.shape[3] == head_dim and work >= MIN_WORK)
