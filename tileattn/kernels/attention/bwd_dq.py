"""The deterministic dQ kernel of the attention backward.

One program owns one block of BLOCK_M queries of one (sequence, query head): it keeps Q, dO,
lse, delta and the fp32 dQ accumulator in registers and walks the key blocks its queries can
see in a fixed order (attention_bwd_scores.visible_block_range), recomputing P:
    dP = dO Vᵀ,   dS = P ∘ (dP - delta) [∘ SCORE_MOD_GRAD],   dQ += dS K
then writes softmax_scale · dQ once. The same inputs give bit-identical dQ on every run; the
default path (ATOMIC_DQ in attention_bwd_dkdv.py) saves this second recomputation of P at the
price of an addition order that varies. With a block mask (BLOCK_MASK_Q > 0: flex_attention)
the tile walks the key blocks the mask lists for its query block instead.

Pointer layouts as in attention_bwd_dkdv.py; dq has q's shape, any strides, last dim
contiguous.
"""

import triton
import triton.language as tl

from .bwd_scores import (blocks_inside, listed_blocks, lse_in_base_2, packed_rows,
                         recompute_probabilities, visible_block_range)
from .masks import load_tile, step_start


@triton.jit
def _dq_over_key_blocks(
    dq, q, do, lse_log2, delta, k_base, v_base, stride_ks, stride_vs,
    offs_m, offs_d, offs_dv, block_start, block_end,
    batch, head, seqlen_q, seqlen_k, softmax_scale, window_left, window_right, mod_args,
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
    BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
    SCORE_MOD: tl.constexpr, SCORE_MOD_GRAD: tl.constexpr, MASK_MOD: tl.constexpr,
    indices_ptr=None, BLOCK_MASK_KV: tl.constexpr = 0,
):
    """Accumulate dQ over key blocks [block_start, block_end), or with BLOCK_MASK_KV > 0 over
    the BLOCK_N-wide steps block_start ..< block_end of a block mask's list (indices_ptr,
    BLOCK_MASK_KV keys per listed block)."""
    step = BLOCK_N if BLOCK_MASK_KV == 0 else 1
    for position in tl.range(block_start, block_end, step):
        start_n = step_start(position, indices_ptr, BLOCK_N, BLOCK_MASK_KV)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        keys = offs_n[:, None].to(tl.int64)
        k = load_tile(k_base + keys * stride_ks + offs_d[None, :], offs_n < seqlen_k, offs_d < HEAD_DIM,
                      MASKED, HEAD_DIM != HEAD_DIM_PAD)
        v = load_tile(v_base + keys * stride_vs + offs_dv[None, :], offs_n < seqlen_k, offs_dv < HEAD_DIM_V,
                      MASKED, HEAD_DIM_V != HEAD_DIM_V_PAD)
        p, score_grad = recompute_probabilities(
            tl.dot(q, tl.trans(k)), lse_log2[:, None], batch, head, offs_m[:, None],
            offs_n[None, :], seqlen_q, seqlen_k, softmax_scale, window_left, window_right,
            mod_args, MASKED, BOUNDED_LEFT, BOUNDED_RIGHT, SCORE_MOD, SCORE_MOD_GRAD, MASK_MOD)
        ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
        if SCORE_MOD is not None:
            ds = ds * score_grad
        dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@triton.jit
def _dq_over_visible_range(
    q, do, lse_log2, delta, k_base, v_base, stride_ks, stride_vs, offs_m, offs_d, offs_dv,
    start_m, batch, head, seqlen_q, seqlen_k, softmax_scale, window_left, window_right, mod_args,
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
    SCORE_MOD: tl.constexpr, SCORE_MOD_GRAD: tl.constexpr, MASK_MOD: tl.constexpr,
):
    """dQ of the query tile at start_m over the key blocks its window bounds let it see."""
    first, full_start, full_end, end = visible_block_range(
        start_m, seqlen_q, seqlen_k, seqlen_k - seqlen_q, window_left, window_right,
        BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT)
    if MASK_MOD is not None:   # the hook may hide any pair: every block takes the mask
        full_start = end
        full_end = end
    dq = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    # Masked blocks before the full ones (the window's left edge), the full ones, then the
    # masked ones after (the causal diagonal or the window's right edge, the sequence end).
    dq = _dq_over_key_blocks(
        dq, q, do, lse_log2, delta, k_base, v_base, stride_ks, stride_vs, offs_m, offs_d,
        offs_dv, first, full_start, batch, head, seqlen_q, seqlen_k, softmax_scale, window_left,
        window_right, mod_args, HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD, HEAD_DIM_V_PAD, BLOCK_N,
        True, BOUNDED_LEFT, BOUNDED_RIGHT, SCORE_MOD, SCORE_MOD_GRAD, MASK_MOD)
    dq = _dq_over_key_blocks(
        dq, q, do, lse_log2, delta, k_base, v_base, stride_ks, stride_vs, offs_m, offs_d,
        offs_dv, full_start, full_end, batch, head, seqlen_q, seqlen_k, softmax_scale,
        window_left, window_right, mod_args, HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD, HEAD_DIM_V_PAD,
        BLOCK_N, False, BOUNDED_LEFT, BOUNDED_RIGHT, SCORE_MOD, SCORE_MOD_GRAD, MASK_MOD)
    dq = _dq_over_key_blocks(
        dq, q, do, lse_log2, delta, k_base, v_base, stride_ks, stride_vs, offs_m, offs_d,
        offs_dv, full_end, end, batch, head, seqlen_q, seqlen_k, softmax_scale, window_left,
        window_right, mod_args, HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD, HEAD_DIM_V_PAD, BLOCK_N,
        True, BOUNDED_LEFT, BOUNDED_RIGHT, SCORE_MOD, SCORE_MOD_GRAD, MASK_MOD)
    return dq


@triton.jit
def _dq_over_block_lists(
    q, do, lse_log2, delta, k_base, v_base, stride_ks, stride_vs, offs_m, offs_d, offs_dv,
    block_lists, q_block, batch, head, seqlen_q, seqlen_k, softmax_scale, mod_args,
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SCORE_MOD: tl.constexpr, SCORE_MOD_GRAD: tl.constexpr, MASK_MOD: tl.constexpr,
    BLOCK_MASK_KV: tl.constexpr,
):
    """dQ of a query tile over the key blocks a block mask lists for its block q_block: the
    partial ones with MASK_MOD, then the full ones without (bounds-masked only where a listed
    block crosses the keys' end). Literal: no window or causal bounds."""
    STEPS: tl.constexpr = BLOCK_MASK_KV // BLOCK_N
    dq = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    count, indices = listed_blocks(block_lists, 0, batch, head, q_block)
    dq = _dq_over_key_blocks(
        dq, q, do, lse_log2, delta, k_base, v_base, stride_ks, stride_vs, offs_m, offs_d,
        offs_dv, 0, count * STEPS, batch, head, seqlen_q, seqlen_k, softmax_scale, -1, -1,
        mod_args, HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD, HEAD_DIM_V_PAD, BLOCK_N, True, False,
        False, SCORE_MOD, SCORE_MOD_GRAD, MASK_MOD, indices, BLOCK_MASK_KV)
    count, indices = listed_blocks(block_lists, 8, batch, head, q_block)
    inside = blocks_inside(count, indices, BLOCK_MASK_KV, seqlen_k)
    dq = _dq_over_key_blocks(
        dq, q, do, lse_log2, delta, k_base, v_base, stride_ks, stride_vs, offs_m, offs_d,
        offs_dv, 0, inside * STEPS, batch, head, seqlen_q, seqlen_k, softmax_scale, -1, -1,
        mod_args, HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD, HEAD_DIM_V_PAD, BLOCK_N, False, False,
        False, SCORE_MOD, SCORE_MOD_GRAD, None, indices, BLOCK_MASK_KV)
    dq = _dq_over_key_blocks(
        dq, q, do, lse_log2, delta, k_base, v_base, stride_ks, stride_vs, offs_m, offs_d,
        offs_dv, inside * STEPS, count * STEPS, batch, head, seqlen_q, seqlen_k, softmax_scale,
        -1, -1, mod_args, HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD, HEAD_DIM_V_PAD, BLOCK_N, True,
        False, False, SCORE_MOD, SCORE_MOD_GRAD, None, indices, BLOCK_MASK_KV)
    return dq


@triton.jit
def attention_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
    cu_seqlens_q, cu_seqlens_k,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_dob, stride_dos, stride_doh,
    stride_dqb, stride_dqs, stride_dqh,
    stride_lse_b, stride_lse_h,
    seqlen_q, seqlen_k, gqa_group_size,
    softmax_scale, window_left, window_right, mod_args, block_lists,
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_VARLEN: tl.constexpr,
    BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
    SCORE_MOD: tl.constexpr, SCORE_MOD_GRAD: tl.constexpr, MASK_MOD: tl.constexpr,
    BLOCK_MASK_Q: tl.constexpr = 0, BLOCK_MASK_KV: tl.constexpr = 0,
):
    """Grid (query blocks of the longest sequence, num_q_heads, batch). block_lists: () or,
    with BLOCK_MASK_Q > 0 (mask blocks of BLOCK_MASK_Q queries x BLOCK_MASK_KV keys; dense,
    no window), the mask's partial then full key-block lists per query block, 8 entries each
    (bwd_scores.listed_blocks)."""
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1)
    batch = tl.program_id(2)
    kv_head = head // gqa_group_size
    q_start, seqlen_q = packed_rows(batch, cu_seqlens_q, seqlen_q, IS_VARLEN)
    k_start, seqlen_k = packed_rows(batch, cu_seqlens_k, seqlen_k, IS_VARLEN)
    if start_m >= seqlen_q:
        return   # varlen: a sequence shorter than the longest
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    offs_dv = tl.arange(0, HEAD_DIM_V_PAD)
    rows = (q_start + offs_m)[:, None].to(tl.int64)
    q_base = q_ptr + batch.to(tl.int64) * stride_qb + head.to(tl.int64) * stride_qh
    do_base = do_ptr + batch.to(tl.int64) * stride_dob + head.to(tl.int64) * stride_doh
    q = load_tile(q_base + rows * stride_qs + offs_d[None, :], offs_m < seqlen_q, offs_d < HEAD_DIM,
                      True, HEAD_DIM != HEAD_DIM_PAD)
    do = load_tile(do_base + rows * stride_dos + offs_dv[None, :], offs_m < seqlen_q, offs_dv < HEAD_DIM_V,
                      True, HEAD_DIM_V != HEAD_DIM_V_PAD).to(q.dtype)
    lse_offset = batch.to(tl.int64) * stride_lse_b + head.to(tl.int64) * stride_lse_h + q_start
    lse_log2 = lse_in_base_2(lse_ptr + lse_offset + offs_m, offs_m, seqlen_q, True)
    delta = tl.load(delta_ptr + lse_offset + offs_m, mask=offs_m < seqlen_q, other=0.0)

    k_base = (k_ptr + batch.to(tl.int64) * stride_kb + kv_head.to(tl.int64) * stride_kh
              + k_start * stride_ks)
    v_base = (v_ptr + batch.to(tl.int64) * stride_vb + kv_head.to(tl.int64) * stride_vh
              + k_start * stride_vs)
    if BLOCK_MASK_Q > 0:
        dq = _dq_over_block_lists(
            q, do, lse_log2, delta, k_base, v_base, stride_ks, stride_vs, offs_m, offs_d,
            offs_dv, block_lists, start_m // BLOCK_MASK_Q, batch, head, seqlen_q, seqlen_k,
            softmax_scale, mod_args, HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD, HEAD_DIM_V_PAD, BLOCK_M,
            BLOCK_N, SCORE_MOD, SCORE_MOD_GRAD, MASK_MOD, BLOCK_MASK_KV)
    else:
        dq = _dq_over_visible_range(
            q, do, lse_log2, delta, k_base, v_base, stride_ks, stride_vs, offs_m, offs_d,
            offs_dv, start_m, batch, head, seqlen_q, seqlen_k, softmax_scale, window_left,
            window_right, mod_args, HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD, HEAD_DIM_V_PAD, BLOCK_M,
            BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT, SCORE_MOD, SCORE_MOD_GRAD, MASK_MOD)

    dq = dq * softmax_scale   # the scale of the score's derivative, applied once
    dq_ptrs = (dq_ptr + batch.to(tl.int64) * stride_dqb + head.to(tl.int64) * stride_dqh
               + rows * stride_dqs + offs_d[None, :])
    tl.store(dq_ptrs, dq.to(dq_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM))
