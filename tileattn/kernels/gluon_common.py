"""What both Gluon (sm90) kernels share: the torch -> Gluon dtype map, the TMA addressability
check, and the online-softmax step of one score block (attention_sm90.py, mla_sm90.py)."""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

GL_DTYPES = {
    torch.float16: gl.float16, torch.bfloat16: gl.bfloat16,
    torch.float8_e4m3fn: gl.float8e4nv, torch.float8_e5m2: gl.float8e5,
}


def tma_ready(x: torch.Tensor, dims: tuple[int, ...]) -> bool:
    """TMA needs a 16-byte aligned base and 16-byte aligned strides for all but the last dim."""
    size = x.element_size()
    return x.data_ptr() % 16 == 0 and all(x.stride(d) * size % 16 == 0 for d in dims)


@gluon.jit
def online_softmax(s, m_i, l_i, qk_scale, MASKED: gl.constexpr):
    """One block of the online softmax in base 2, on scores s whose invisible entries the
    caller has set to -inf (only when MASKED): returns (p, alpha, m_new, l_new)."""
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    if MASKED:
        # A row that has seen no visible key keeps m = -inf; subtract 0 so exp2 gives 0, not NaN.
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_safe = m_new
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_safe, 1))
    alpha = gl.exp2(m_i - m_safe)
    l_new = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_new
