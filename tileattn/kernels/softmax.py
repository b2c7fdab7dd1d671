"""The online-softmax step shared by the Triton kernels (inlined by Triton at each call site)."""

import triton
import triton.language as tl


@triton.jit
def online_softmax_step(qk, m_i, l_i, acc, qk_scale, MASKED: tl.constexpr):
    """Fold one block of raw scores qk [M, N] into the running (max m_i, sum l_i, acc).

    Works in base 2: qk_scale already holds softmax_scale * log2(e) (and any FP8 descales).
    Returns p = exp2(qk * qk_scale - m_new) for the P @ V product, the rescaled accumulator,
    the new sum and the new max. With MASKED, masked scores are -inf and a row that has seen no
    visible key keeps m = -inf: it subtracts 0 instead, so exp2 gives 0 rather than NaN.
    """
    p, alpha, l_i, m_new = online_softmax_probs(qk, m_i, l_i, qk_scale, MASKED)
    acc = acc * alpha[:, None]
    return p, acc, l_i, m_new


@triton.jit
def online_softmax_probs(qk, m_i, l_i, qk_scale, MASKED: tl.constexpr):
    """online_softmax_step without the accumulator: returns p, the factor alpha [M] that the
    caller multiplies its accumulator(s) by, the new sum and the new max."""
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    if MASKED:
        m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new_safe = m_new
    p = tl.math.exp2(qk * qk_scale - m_new_safe[:, None])
    alpha = tl.math.exp2(m_i - m_new_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    return p, alpha, l_i, m_new

