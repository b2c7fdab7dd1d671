"""The dK/dV kernel of the attention backward (FlashAttention-2 style), optionally also dQ.

One program owns one block of BLOCK_N keys of one (sequence, kv head). It keeps the block's K
and V and the fp32 dK, dV accumulators in registers and walks, for each query head of its GQA
group, the query blocks that can see its keys (attention_bwd_scores.visible_block_range),
recomputing P from q, k and the forward's lse:
    dV += Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP - delta) [∘ SCORE_MOD_GRAD],   dK += dSᵀ Q
so the group's sum over query heads needs no atomics and its order is fixed. The tile is
computed transposed (keys along rows: sᵀ = K Qᵀ), which makes Pᵀ and dSᵀ the left operands
of their products as they come out of the MMA, with no transpose.

With ATOMIC_DQ the program also adds dQ = dS K (unscaled) into an fp32 buffer by atomics, so
one pass recomputes P once for all three gradients; the order of those additions is not fixed.
Without it, attention_bwd_dq.py computes dQ in a second, deterministic kernel.

With a block mask (BLOCK_MASK_KV > 0: flex_attention) the program walks the query blocks the
mask's transposed lists give its key block instead (_dkdv_over_block_lists).

Pointer layouts (element strides; last dims contiguous; varlen: no batch dim, rows of all
sequences packed, each sequence's rows found through cu_seqlens):
    q, dout     [batch, seqlen_q, num_q_heads, head_dim | head_dim_v]   varlen [total_q, ...]
    k, v        [batch, seqlen_k, num_kv_heads, head_dim | head_dim_v]  varlen [total_k, ...]
    dk, dv      k's and v's shapes, any strides (e.g. slices of one fused gradient buffer)
    lse, delta  float32 [batch, num_q_heads, seqlen_q] (varlen [num_q_heads, total_q]),
                seqlen dim contiguous; lse natural log, -inf for a row that sees no key
    dq_accum    float32, q's shape with head_dim columns, zeroed (ATOMIC_DQ only)
    cu_seqlens_q, cu_seqlens_k  int32 [batch + 1] (IS_VARLEN only)
"""

import triton
import triton.language as tl

from .bwd_scores import (blocks_inside, listed_blocks, lse_in_base_2, packed_rows,
                         recompute_probabilities, visible_block_range)
from .masks import load_tile, step_start


@triton.jit
def _dkdv_over_query_blocks(
    dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base,
    stride_qs, stride_dos, stride_dq_accum_s,
    offs_n, offs_d, offs_dv, block_start, block_end,
    batch, head, seqlen_q, seqlen_k, softmax_scale, window_left, window_right, mod_args,
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, MASKED: tl.constexpr, ATOMIC_DQ: tl.constexpr,
    BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
    SCORE_MOD: tl.constexpr, SCORE_MOD_GRAD: tl.constexpr, MASK_MOD: tl.constexpr,
    indices_ptr=None, BLOCK_MASK_Q: tl.constexpr = 0,
):
    """Accumulate one query head's contribution from query blocks [block_start, block_end), or
    with BLOCK_MASK_Q > 0 from the BLOCK_M-wide steps block_start ..< block_end of a block
    mask's list (indices_ptr, BLOCK_MASK_Q queries per listed block)."""
    step = BLOCK_M if BLOCK_MASK_Q == 0 else 1
    for position in tl.range(block_start, block_end, step):
        start_m = step_start(position, indices_ptr, BLOCK_M, BLOCK_MASK_Q)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        rows = offs_m[:, None].to(tl.int64)
        q = load_tile(q_base + rows * stride_qs + offs_d[None, :], offs_m < seqlen_q, offs_d < HEAD_DIM,
                      MASKED, HEAD_DIM != HEAD_DIM_PAD)
        lse_log2 = lse_in_base_2(lse_base + offs_m, offs_m, seqlen_q, MASKED)
        p_t, score_grad_t = recompute_probabilities(
            tl.dot(k, tl.trans(q)), lse_log2[None, :], batch, head, offs_m[None, :],
            offs_n[:, None], seqlen_q, seqlen_k, softmax_scale, window_left, window_right,
            mod_args, MASKED, BOUNDED_LEFT, BOUNDED_RIGHT, SCORE_MOD, SCORE_MOD_GRAD, MASK_MOD)
        do = load_tile(do_base + rows * stride_dos + offs_dv[None, :], offs_m < seqlen_q, offs_dv < HEAD_DIM_V,
                      MASKED, HEAD_DIM_V != HEAD_DIM_V_PAD).to(q.dtype)
        dv = tl.dot(p_t.to(q.dtype), do, dv)
        if MASKED:
            delta = tl.load(delta_base + offs_m, mask=offs_m < seqlen_q, other=0.0)
        else:
            delta = tl.load(delta_base + offs_m)
        ds_t = p_t * (tl.dot(v, tl.trans(do)) - delta[None, :])
        if SCORE_MOD is not None:
            ds_t = ds_t * score_grad_t
        ds_t = ds_t.to(q.dtype)
        dk = tl.dot(ds_t, q, dk)
        if ATOMIC_DQ:
            dq = tl.dot(tl.trans(ds_t), k)
            dq_mask = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
            tl.atomic_add(dq_base + rows * stride_dq_accum_s + offs_d[None, :], dq, mask=dq_mask,
                          sem="relaxed")
    return dk, dv


@triton.jit
def _dkdv_over_visible_range(
    dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base,
    stride_qs, stride_dos, stride_dq_accum_s, offs_n, offs_d, offs_dv,
    first, full_start, full_end, end,
    batch, head, seqlen_q, seqlen_k, softmax_scale, window_left, window_right, mod_args,
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, ATOMIC_DQ: tl.constexpr,
    BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
    SCORE_MOD: tl.constexpr, SCORE_MOD_GRAD: tl.constexpr, MASK_MOD: tl.constexpr,
):
    """One query head's contribution from the query blocks the window bounds let the key
    block see (visible_block_range's first, full_start, full_end, end)."""
    # Masked blocks before the full ones (the window's right edge, or the causal diagonal),
    # the full ones, then the masked ones after (the window's left edge, the sequence end).
    dk, dv = _dkdv_over_query_blocks(
        dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base,
        stride_qs, stride_dos, stride_dq_accum_s, offs_n, offs_d, offs_dv, first, full_start,
        batch, head, seqlen_q, seqlen_k, softmax_scale, window_left, window_right, mod_args,
        HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD, HEAD_DIM_V_PAD, BLOCK_M, True, ATOMIC_DQ,
        BOUNDED_LEFT, BOUNDED_RIGHT, SCORE_MOD, SCORE_MOD_GRAD, MASK_MOD)
    dk, dv = _dkdv_over_query_blocks(
        dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base,
        stride_qs, stride_dos, stride_dq_accum_s, offs_n, offs_d, offs_dv, full_start,
        full_end, batch, head, seqlen_q, seqlen_k, softmax_scale, window_left, window_right,
        mod_args, HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD, HEAD_DIM_V_PAD, BLOCK_M, False,
        ATOMIC_DQ, BOUNDED_LEFT, BOUNDED_RIGHT, SCORE_MOD, SCORE_MOD_GRAD, MASK_MOD)
    dk, dv = _dkdv_over_query_blocks(
        dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base,
        stride_qs, stride_dos, stride_dq_accum_s, offs_n, offs_d, offs_dv, full_end, end,
        batch, head, seqlen_q, seqlen_k, softmax_scale, window_left, window_right, mod_args,
        HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD, HEAD_DIM_V_PAD, BLOCK_M, True, ATOMIC_DQ,
        BOUNDED_LEFT, BOUNDED_RIGHT, SCORE_MOD, SCORE_MOD_GRAD, MASK_MOD)
    return dk, dv


@triton.jit
def _dkdv_over_block_lists(
    dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base,
    stride_qs, stride_dos, stride_dq_accum_s, offs_n, offs_d, offs_dv,
    block_lists, start_n, batch, head, seqlen_q, seqlen_k, softmax_scale, mod_args,
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ATOMIC_DQ: tl.constexpr,
    SCORE_MOD: tl.constexpr, SCORE_MOD_GRAD: tl.constexpr, MASK_MOD: tl.constexpr,
    BLOCK_MASK_Q: tl.constexpr, BLOCK_MASK_KV: tl.constexpr,
):
    """One query head's contribution from the query blocks a block mask lists for the key
    block (its transposed lists): partial ones with MASK_MOD, then full ones without, but
    bounds-masked where a listed block crosses the queries' end or the key tile crosses the
    keys' end (unmasked steps read every row they touch). Literal: no window or causal."""
    STEPS: tl.constexpr = BLOCK_MASK_Q // BLOCK_M
    kv_block = start_n // BLOCK_MASK_KV
    count, indices = listed_blocks(block_lists, 0, batch, head, kv_block)
    dk, dv = _dkdv_over_query_blocks(
        dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, stride_qs, stride_dos,
        stride_dq_accum_s, offs_n, offs_d, offs_dv, 0, count * STEPS, batch, head, seqlen_q,
        seqlen_k, softmax_scale, -1, -1, mod_args, HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD,
        HEAD_DIM_V_PAD, BLOCK_M, True, ATOMIC_DQ, False, False, SCORE_MOD, SCORE_MOD_GRAD,
        MASK_MOD, indices, BLOCK_MASK_Q)
    count, indices = listed_blocks(block_lists, 8, batch, head, kv_block)
    inside = blocks_inside(count, indices, BLOCK_MASK_Q, seqlen_q)
    inside = tl.where(start_n + BLOCK_N > seqlen_k, 0, inside)
    dk, dv = _dkdv_over_query_blocks(
        dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, stride_qs, stride_dos,
        stride_dq_accum_s, offs_n, offs_d, offs_dv, 0, inside * STEPS, batch, head, seqlen_q,
        seqlen_k, softmax_scale, -1, -1, mod_args, HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD,
        HEAD_DIM_V_PAD, BLOCK_M, False, ATOMIC_DQ, False, False, SCORE_MOD, SCORE_MOD_GRAD,
        None, indices, BLOCK_MASK_Q)
    dk, dv = _dkdv_over_query_blocks(
        dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, stride_qs, stride_dos,
        stride_dq_accum_s, offs_n, offs_d, offs_dv, inside * STEPS, count * STEPS, batch, head,
        seqlen_q, seqlen_k, softmax_scale, -1, -1, mod_args, HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD,
        HEAD_DIM_V_PAD, BLOCK_M, True, ATOMIC_DQ, False, False, SCORE_MOD, SCORE_MOD_GRAD, None,
        indices, BLOCK_MASK_Q)
    return dk, dv


@triton.jit
def attention_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_accum_ptr, dk_ptr, dv_ptr,
    cu_seqlens_q, cu_seqlens_k,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_dob, stride_dos, stride_doh,
    stride_dkb, stride_dks, stride_dkh,
    stride_dvb, stride_dvs, stride_dvh,
    stride_lse_b, stride_lse_h,
    stride_dq_accum_b, stride_dq_accum_s, stride_dq_accum_h,
    seqlen_q, seqlen_k, gqa_group_size,
    softmax_scale, window_left, window_right, mod_args, block_lists,
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_VARLEN: tl.constexpr, ATOMIC_DQ: tl.constexpr,
    BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
    SCORE_MOD: tl.constexpr, SCORE_MOD_GRAD: tl.constexpr, MASK_MOD: tl.constexpr,
    BLOCK_MASK_Q: tl.constexpr = 0, BLOCK_MASK_KV: tl.constexpr = 0,
):
    """Grid (key blocks of the longest sequence, num_kv_heads, batch). lse and delta share
    strides (batch stride 0 for varlen); dq_accum's batch stride is 0 for varlen.
    block_lists: () or, with BLOCK_MASK_KV > 0 (mask blocks of BLOCK_MASK_Q queries x
    BLOCK_MASK_KV keys; dense, no window), the mask's transposed partial then full lists (per
    key block and query head, its query blocks), 8 entries each (bwd_scores.listed_blocks)."""
    start_n = tl.program_id(0) * BLOCK_N
    kv_head = tl.program_id(1)
    batch = tl.program_id(2)
    q_start, seqlen_q = packed_rows(batch, cu_seqlens_q, seqlen_q, IS_VARLEN)
    k_start, seqlen_k = packed_rows(batch, cu_seqlens_k, seqlen_k, IS_VARLEN)
    if start_n >= seqlen_k:
        return   # varlen: a sequence shorter than the longest
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    offs_dv = tl.arange(0, HEAD_DIM_V_PAD)
    keys = (k_start + offs_n)[:, None].to(tl.int64)
    k_base = k_ptr + batch.to(tl.int64) * stride_kb + kv_head.to(tl.int64) * stride_kh
    v_base = v_ptr + batch.to(tl.int64) * stride_vb + kv_head.to(tl.int64) * stride_vh
    k = load_tile(k_base + keys * stride_ks + offs_d[None, :], offs_n < seqlen_k, offs_d < HEAD_DIM,
                      True, HEAD_DIM != HEAD_DIM_PAD)
    v = load_tile(v_base + keys * stride_vs + offs_dv[None, :], offs_n < seqlen_k, offs_dv < HEAD_DIM_V,
                      True, HEAD_DIM_V != HEAD_DIM_V_PAD)
    dk = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM_V_PAD], dtype=tl.float32)

    # Seen from a key, query i is visible iff key + (seqlen_q - seqlen_k) - window_right <= i
    # <= key + (seqlen_q - seqlen_k) + window_left: the query-side bounds swap the window's.
    if BLOCK_MASK_KV == 0:
        first, full_start, full_end, end = visible_block_range(
            start_n, seqlen_k, seqlen_q, seqlen_q - seqlen_k, window_right, window_left,
            BLOCK_N, BLOCK_M, BOUNDED_RIGHT, BOUNDED_LEFT)
        if MASK_MOD is not None:   # the hook may hide any pair: every block takes the mask
            full_start = end
            full_end = end

    for group_index in range(0, gqa_group_size):
        head = kv_head * gqa_group_size + group_index
        q_base = (q_ptr + batch.to(tl.int64) * stride_qb + head.to(tl.int64) * stride_qh
                  + q_start * stride_qs)
        do_base = (do_ptr + batch.to(tl.int64) * stride_dob + head.to(tl.int64) * stride_doh
                   + q_start * stride_dos)
        lse_offset = batch.to(tl.int64) * stride_lse_b + head.to(tl.int64) * stride_lse_h + q_start
        dq_base = dq_accum_ptr
        if ATOMIC_DQ:
            dq_base = (dq_accum_ptr + batch.to(tl.int64) * stride_dq_accum_b
                       + head.to(tl.int64) * stride_dq_accum_h + q_start * stride_dq_accum_s)
        if BLOCK_MASK_KV > 0:
            dk, dv = _dkdv_over_block_lists(
                dk, dv, k, v, q_base, do_base, lse_ptr + lse_offset, delta_ptr + lse_offset,
                dq_base, stride_qs, stride_dos, stride_dq_accum_s, offs_n, offs_d, offs_dv,
                block_lists, start_n, batch, head, seqlen_q, seqlen_k, softmax_scale, mod_args,
                HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD, HEAD_DIM_V_PAD, BLOCK_M, BLOCK_N, ATOMIC_DQ,
                SCORE_MOD, SCORE_MOD_GRAD, MASK_MOD, BLOCK_MASK_Q, BLOCK_MASK_KV)
        else:
            dk, dv = _dkdv_over_visible_range(
                dk, dv, k, v, q_base, do_base, lse_ptr + lse_offset, delta_ptr + lse_offset,
                dq_base, stride_qs, stride_dos, stride_dq_accum_s, offs_n, offs_d, offs_dv,
                first, full_start, full_end, end, batch, head, seqlen_q, seqlen_k,
                softmax_scale, window_left, window_right, mod_args, HEAD_DIM, HEAD_DIM_V,
                HEAD_DIM_PAD, HEAD_DIM_V_PAD, BLOCK_M, ATOMIC_DQ, BOUNDED_LEFT, BOUNDED_RIGHT,
                SCORE_MOD, SCORE_MOD_GRAD, MASK_MOD)

    # dK = softmax_scale · dSᵀ Q: the scale of the score's derivative, applied once here.
    dk = dk * softmax_scale
    key_mask = offs_n[:, None] < seqlen_k
    dk_ptrs = (dk_ptr + batch.to(tl.int64) * stride_dkb + kv_head.to(tl.int64) * stride_dkh
               + keys * stride_dks + offs_d[None, :])
    dv_ptrs = (dv_ptr + batch.to(tl.int64) * stride_dvb + kv_head.to(tl.int64) * stride_dvh
               + keys * stride_dvs + offs_dv[None, :])
    tl.store(dk_ptrs, dk.to(dk_ptr.dtype.element_ty), mask=key_mask & (offs_d[None, :] < HEAD_DIM))
    tl.store(dv_ptrs, dv.to(dv_ptr.dtype.element_ty), mask=key_mask & (offs_dv[None, :] < HEAD_DIM_V))
