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


# Lazy rescaling: the reference max only moves when a block's max exceeds it by more than this
# many powers of two, so P = exp2(s - m) stays below 2^LAZY_RESCALE_LOG2 (256 fits e4m3's 448
# and fp16/bf16) and most blocks skip the accumulator rescale altogether.
LAZY_RESCALE_LOG2 = tl.constexpr(8.0)


@triton.jit
def online_softmax_step_lazy(qk, m_i, l_i, acc, qk_scale, MASKED: tl.constexpr):
    """online_softmax_step that rescales (acc, l_i) only when some row's max grew past
    m_i + LAZY_RESCALE_LOG2.

    m_i is then a reference value at most LAZY_RESCALE_LOG2 below the true running max rather
    than the max itself; l_i stays the sum of exp2(s - m_i), so m_i + log2(l_i) is still the
    log-sum-exp. The test is block-uniform (one reduction over the tile's rows), so the common case — no
    row's max grew that much — skips one multiply per accumulator element (FlashAttention-4's
    conditional rescaling).
    """
    m_block = tl.max(qk, 1) * qk_scale
    grows = m_block > m_i + LAZY_RESCALE_LOG2
    if tl.max(grows.to(tl.int32), 0) > 0:
        m_i_new = tl.where(grows, tl.maximum(m_i, m_block), m_i)
        if MASKED:
            m_i_new_safe = tl.where(m_i_new == float("-inf"), 0.0, m_i_new)
        else:
            m_i_new_safe = m_i_new
        alpha = tl.math.exp2(m_i - m_i_new_safe)
        l_i = l_i * alpha
        acc = acc * alpha[:, None]
        m_i = m_i_new
    if MASKED:
        m_safe = tl.where(m_i == float("-inf"), 0.0, m_i)
    else:
        m_safe = m_i
    p = tl.math.exp2(qk * qk_scale - m_safe[:, None])
    l_i = l_i + tl.sum(p, 1)
    return p, acc, l_i, m_i
