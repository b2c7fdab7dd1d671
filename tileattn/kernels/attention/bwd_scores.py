"""What a backward tile sees, shared by the dK/dV and the dQ kernels: where its sequence lies,
which blocks of the other axis the causal/window bounds let it visit, and the probabilities
P recomputed from q·kᵀ and the forward's log-sum-exp, with the score/mask hooks applied.

Visibility (bottom-right aligned, per sequence): with shift = seqlen_k - seqlen_q, query i sees
key j iff  i + shift - window_left <= j <= i + shift + window_right  and both are in bounds; a
window side that is unbounded (-1) drops its inequality, and causal is window_right = 0. The
kernels visit only blocks holding a visible pair (work scales with the window) and skip the
mask arithmetic on blocks that every pair of the tile sees.

With a block mask (FlexAttention's BlockMask, literal: no bounds but the sequence ends) a tile
visits the blocks the mask lists for it instead (listed_blocks): partial ones with MASK_MOD,
full ones without, the sequence-end mask only where a block crosses an end.

Hooks (SCORE_MOD / SCORE_MOD_GRAD / MASK_MOD with their mod_args tuple) are called as
    SCORE_MOD(score, batch, head, q_idx, kv_idx, q_shift, mod_args) -> fp32 modified score
    SCORE_MOD_GRAD(same arguments)                                -> fp32 d SCORE_MOD / d score
    MASK_MOD(batch, head, q_idx, kv_idx, q_shift, mod_args)       -> int1, True = keep
with score = q·kᵀ · softmax_scale in natural-log units, q_idx/kv_idx the positions within the
sequence and head the query head. They must be elementwise: the dK/dV kernel works on the
transposed tile (keys along rows), so it passes q_idx [1, BLOCK_M] and kv_idx [BLOCK_N, 1].
"""

import triton
import triton.language as tl


@triton.jit
def packed_rows(batch, cu_seqlens, seqlen, IS_VARLEN: tl.constexpr):
    """(first row of sequence `batch` in its tensor, its length). Dense inputs start every
    sequence at row 0 (the batch stride selects it) and have the length given; varlen inputs
    read both from the int32 cu_seqlens [batch + 1]. The first row is int64: times a row
    stride it may pass 2**31."""
    if IS_VARLEN:
        start = tl.load(cu_seqlens + batch)
        seqlen = tl.load(cu_seqlens + batch + 1) - start
        start = start.to(tl.int64)
    else:
        start = 0
    return start, seqlen


@triton.jit
def visible_block_range(tile_start, tile_len, other_len, shift, below, above,
                        TILE: tl.constexpr, BLOCK: tl.constexpr,
                        BOUNDED_BELOW: tl.constexpr, BOUNDED_ABOVE: tl.constexpr):
    """The blocks of BLOCK positions x (along the other axis, x < other_len) that rows t of the
    tile [tile_start, tile_start + TILE) (t < tile_len) see, where t sees x iff
    t + shift - below <= x <= t + shift + above (a side without its BOUNDED_* flag is open).

    Returns (first, full_start, full_end, end): the visited blocks start at first, full_start
    and full_end and run to end (exclusive); those in [full_start, full_end) lie in bounds and
    every row of the tile sees every position of them (no mask needed), the others need the
    mask. first, full_start and full_end are multiples of BLOCK or equal to end. Only blocks
    holding a visible pair are visited. All integer division is of non-negative numbers:
    compiled Triton truncates toward zero where the interpreter floors.
    """
    tile_last = tl.minimum(tile_start + TILE, tile_len) - 1
    if BOUNDED_BELOW:
        lo = tl.maximum(tile_start + shift - below, 0)
    else:
        lo = tl.zeros((), tl.int32)
    if BOUNDED_ABOVE:
        end = tl.maximum(tl.minimum(tile_last + shift + above + 1, other_len), 0)
    else:
        end = other_len + tl.zeros((), tl.int32)
    first = tl.where(end > lo, lo // BLOCK * BLOCK, end)
    # Full blocks: every row's lowest visible x at or before the block, every row's highest at
    # or after its end; none for a tile that crosses tile_len (its rows past it hold nothing).
    if BOUNDED_BELOW:
        full_start = tl.cdiv(tl.maximum(tile_start + TILE - 1 + shift - below, 0), BLOCK) * BLOCK
        full_start = tl.maximum(full_start, first)
    else:
        full_start = first
    full_start = tl.minimum(full_start, end)
    if BOUNDED_ABOVE:
        full_end = tl.maximum(tl.minimum(tile_start + shift + above + 1, other_len), 0) // BLOCK * BLOCK
    else:
        full_end = other_len // BLOCK * BLOCK
    full_end = tl.minimum(tl.maximum(full_end, full_start), end)
    full_end = tl.where(tile_start + TILE > tile_len, full_start, full_end)
    return first, full_start, full_end, end


@triton.jit
def listed_blocks(block_lists, FIRST: tl.constexpr, batch, head, row):
    """One row of a block mask's list: (count, pointer to its first index). block_lists holds,
    from FIRST on, the counts pointer [B, H, rows], the indices pointer [B, H, rows, width]
    (last dim contiguous), the counts' three strides, then the indices' first three."""
    count = tl.load(block_lists[FIRST] + batch * block_lists[FIRST + 2]
                    + head * block_lists[FIRST + 3] + row * block_lists[FIRST + 4])
    indices = (block_lists[FIRST + 1] + batch.to(tl.int64) * block_lists[FIRST + 5]
               + head.to(tl.int64) * block_lists[FIRST + 6]
               + row.to(tl.int64) * block_lists[FIRST + 7])
    return count, indices


@triton.jit
def blocks_inside(count, indices, BLOCK: tl.constexpr, length):
    """How many of a list's count blocks (of BLOCK positions, ascending) end by length: all but
    a last one that crosses it, which then needs the bounds mask."""
    crosses = 0
    if count > 0:
        crosses = ((tl.load(indices + count - 1) + 1) * BLOCK > length).to(tl.int32)
    return count - crosses


@triton.jit
def recompute_probabilities(qk, lse_log2, batch, head, q_idx, kv_idx, seqlen_q, seqlen_k,
                            softmax_scale, window_left, window_right, mod_args,
                            MASKED: tl.constexpr, BOUNDED_LEFT: tl.constexpr,
                            BOUNDED_RIGHT: tl.constexpr, SCORE_MOD: tl.constexpr,
                            SCORE_MOD_GRAD: tl.constexpr, MASK_MOD: tl.constexpr):
    """P = exp(SCORE_MOD(qk · softmax_scale) - lse) on one tile, 0 where a pair is not visible,
    and d SCORE_MOD / d score (0 where not visible; 1.0 without a score hook).

    qk, q_idx, kv_idx and lse_log2 (the forward's lse in base 2, +inf for a row that saw no key
    or lies past the sequence, which makes its P exactly 0) broadcast to the tile's shape in
    either orientation. MASKED applies the sequence bounds and the window; MASK_MOD is applied
    wherever it is set.
    """
    q_shift = seqlen_k - seqlen_q
    if SCORE_MOD is not None:
        score = qk * softmax_scale
        score_grad = SCORE_MOD_GRAD(score, batch, head, q_idx, kv_idx, q_shift, mod_args)
        logits = SCORE_MOD(score, batch, head, q_idx, kv_idx, q_shift, mod_args) * 1.4426950408889634
    else:
        score_grad = 1.0
        logits = qk * (softmax_scale * 1.4426950408889634)
    if MASKED or MASK_MOD is not None:
        visible = (q_idx < seqlen_q) & (kv_idx < seqlen_k)
        if BOUNDED_LEFT:
            visible = visible & (kv_idx >= q_idx + q_shift - window_left)
        if BOUNDED_RIGHT:
            visible = visible & (kv_idx <= q_idx + q_shift + window_right)
        if MASK_MOD is not None:
            visible = visible & MASK_MOD(batch, head, q_idx, kv_idx, q_shift, mod_args)
        logits = tl.where(visible, logits, float("-inf"))
        if SCORE_MOD is not None:
            # Hooks see positions past the sequence too; whatever they return there is dropped.
            score_grad = tl.where(visible, score_grad, 0.0)
    return tl.math.exp2(logits - lse_log2), score_grad


@triton.jit
def lse_in_base_2(lse_ptrs, rows, num_rows, MASKED: tl.constexpr):
    """The forward's natural-log lse of `rows` in base 2; +inf for a row that saw no key (lse
    -inf) or lies at or past num_rows, so that exp2(logits - lse) is exactly 0 there."""
    if MASKED:
        lse = tl.load(lse_ptrs, mask=rows < num_rows, other=float("inf"))
    else:
        lse = tl.load(lse_ptrs)
    return tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
