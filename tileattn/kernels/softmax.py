"""The online-softmax step shared by the Triton kernels (inlined by Triton at each call site)."""

import triton
import triton.language as tl


@triton.jit
def online_softmax_step(qk, m_i, l_i, acc, qk_scale, MASKED: tl.constexpr,
                        P_OFFSET: tl.constexpr = 0.0, row_offset=None):
    """Fold one block of raw scores qk [M, N] into the running (max m_i, sum l_i, acc).

    Works in base 2: qk_scale already holds softmax_scale * log2(e) (and any FP8 descales).
    Returns p = exp2(qk * qk_scale - m_new + P_OFFSET) for the P @ V product, the rescaled
    accumulator, the new sum and the new max. P_OFFSET scales p and the sum alike (so the
    output is unchanged, and lse must subtract it): FP8 P then spans [0, 2^P_OFFSET], inside
    e4m3's normal range, instead of [0, 1] where the small probabilities of a row with one
    dominant key would flush to e4m3's subnormals. With MASKED, masked scores are -inf and a
    row that has seen no visible key keeps m = -inf: it subtracts 0 instead, so exp2 gives 0
    rather than NaN. With row_offset (a row vector), row r's scores are
    qk * qk_scale + row_offset[r].
    """
    p, alpha, l_i, m_new = online_softmax_probs(qk, m_i, l_i, qk_scale, MASKED, P_OFFSET,
                                                row_offset)
    acc = acc * alpha[:, None]
    return p, acc, l_i, m_new


@triton.jit
def online_softmax_probs(qk, m_i, l_i, qk_scale, MASKED: tl.constexpr,
                         P_OFFSET: tl.constexpr = 0.0, row_offset=None):
    """online_softmax_step without the accumulator: returns p, the factor alpha [M] that the
    caller multiplies its accumulator(s) by, the new sum and the new max."""
    if row_offset is not None:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale + row_offset)
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    if MASKED:
        m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new_safe = m_new
    if row_offset is not None:
        p = tl.math.exp2(qk * qk_scale - (m_new_safe - P_OFFSET - row_offset)[:, None])
    elif P_OFFSET != 0.0:
        p = tl.math.exp2(qk * qk_scale - (m_new_safe - P_OFFSET)[:, None])
    else:
        p = tl.math.exp2(qk * qk_scale - m_new_safe[:, None])
    alpha = tl.math.exp2(m_i - m_new_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    return p, alpha, l_i, m_new

