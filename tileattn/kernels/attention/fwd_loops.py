"""The portable forward kernel's key loops (fwd.py): the online-softmax update over a range of
key blocks or a block mask's list of them, with the masks, hooks and paged addressing of
masks.py and docs/design.md ("Mods"). Layouts are fwd.py's."""

import triton
import triton.language as tl

from ..softmax import online_softmax_step
from .masks import load_tile, paged_rows, step_start, visible

_LOG2_E = tl.constexpr(1.4426950408889634)
_LN_2 = tl.constexpr(0.6931471805599453)


@triton.jit
def attend_key_blocks(
    acc, l_i, m_i, bad_page, q, start, end, indices_ptr,
    k_base, v_base, stride_ks, stride_vs, stride_vd, block_table_row, num_pages,
    stride_k_page, stride_v_page,
    batch, head, offs_m, offs_n, offs_d, offs_dv, seqlen_k, shift, window_left, window_right,
    qk_scale, k_descale_row, stride_k_descale_t, mod_args,
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    PAGE_SIZE: tl.constexpr, SCORE_MOD: tl.constexpr, MASK_MOD: tl.constexpr,
    K_DESCALE_BLOCK: tl.constexpr, P_OFFSET: tl.constexpr, BLOCK_MASK_KV: tl.constexpr = 0,
    SCORE_LINEAR: tl.constexpr = False,
):
    """Online-softmax update of (acc, l_i, m_i) over key blocks of BLOCK_N: the keys
    [start, end) when BLOCK_MASK_KV is 0, else the BLOCK_N-wide steps start ..< end of a block
    mask's list (indices_ptr; BLOCK_MASK_KV keys per listed block). One flat loop either way,
    so that the compiler pipelines its loads across listed blocks. MASKED applies the sequence
    end, the window bounds and MASK_MOD; keys at or past seqlen_k load as zeros.
    qk_scale: softmax scale in base 2 with the descales of a tile; with K_DESCALE_BLOCK > 0
    each key block also multiplies it by its k descale (k_descale_row: this (batch, kv head)'s
    row of a block descale, K_DESCALE_BLOCK keys per entry, stride_k_descale_t apart).
    SCORE_LINEAR: SCORE_MOD is score + c (q_idx - kv_idx) + d (flex/linear.py; or the built-in
    ALiBi under causal), added as a term per key column and one per row and block."""
    step = BLOCK_N if BLOCK_MASK_KV == 0 else 1
    # Contiguous keys in range order: pointers advance by a block each step (no per-row
    # address arithmetic in the loop); listed or paged keys: each block's rows are computed.
    k_ptrs = k_base + (start + offs_n)[:, None].to(tl.int64) * stride_ks + offs_d[None, :]
    v_ptrs = (v_base + (start + offs_n)[:, None].to(tl.int64) * stride_vs
              + offs_dv[None, :] * stride_vd)
    # Listed blocks: each block's pointers are one scalar offset from key 0's (loop-invariant).
    k_block = offs_n[:, None].to(tl.int64) * stride_ks + offs_d[None, :]
    v_block = offs_n[:, None].to(tl.int64) * stride_vs + offs_dv[None, :] * stride_vd
    if SCORE_LINEAR:
        # c (start_n - kv) in base 2, the same for every block: the hook at query BLOCK_N >= kv
        # (where the built-in ALiBi's |q - kv| is linear) less its value at key 0.
        probe = offs_n * 0 + BLOCK_N
        zero = tl.zeros([BLOCK_N], dtype=tl.float32)
        score_columns = (SCORE_MOD(zero, batch, head, probe, offs_n, 0, mod_args)
                         - SCORE_MOD(zero, batch, head, probe, offs_n * 0, 0, mod_args)) * _LOG2_E
    for position in tl.range(start, end, step):
        start_n = step_start(position, indices_ptr, BLOCK_N, BLOCK_MASK_KV)
        cols = start_n + offs_n
        key_ok = cols < seqlen_k
        if PAGE_SIZE > 0:
            k_rows, bad = paged_rows(block_table_row, start_n, offs_n, seqlen_k, num_pages,
                                     stride_k_page, stride_ks, PAGE_SIZE, BLOCK_N)
            v_rows, _ = paged_rows(block_table_row, start_n, offs_n, seqlen_k, num_pages,
                                   stride_v_page, stride_vs, PAGE_SIZE, BLOCK_N)
            bad_page = bad_page | bad
            k_ptrs = k_base + k_rows[:, None] + offs_d[None, :]
            v_ptrs = v_base + v_rows[:, None] + offs_dv[None, :] * stride_vd
        elif BLOCK_MASK_KV > 0:
            k_ptrs = k_base + start_n.to(tl.int64) * stride_ks + k_block
            v_ptrs = v_base + start_n.to(tl.int64) * stride_vs + v_block
        k = load_tile(k_ptrs, key_ok, offs_d < HEAD_DIM, MASKED, HEAD_DIM != HEAD_DIM_PAD)
        qk = tl.dot(q, tl.trans(k))
        block_scale = qk_scale
        if K_DESCALE_BLOCK > 0:
            # Block descales: BLOCK_N divides K_DESCALE_BLOCK, so the block has one k descale.
            block_scale *= tl.load(k_descale_row + (start_n // K_DESCALE_BLOCK)
                                   * stride_k_descale_t)
        row_offset = None
        if SCORE_LINEAR:
            # The hook at each row and the block's first key, once per row (rows that see a
            # key of the block are at or past start_n, as the built-in ALiBi's form needs).
            qk = qk * block_scale + score_columns[None, :]
            row_offset = SCORE_MOD((offs_m * 0).to(tl.float32), batch, head, offs_m,
                                   offs_m * 0 + start_n, shift, mod_args) * _LOG2_E
            step_scale = 1.0
        elif SCORE_MOD is not None:
            # Hooks see natural-log scores; the softmax then works in base 2.
            qk = SCORE_MOD(qk * (block_scale * _LN_2), batch, head, offs_m[:, None],
                           cols[None, :], shift, mod_args) * _LOG2_E
            step_scale = 1.0
        else:
            step_scale = block_scale
        if MASKED:
            seen = visible(offs_m, cols, seqlen_k, shift, window_left, window_right,
                           HAS_LEFT, HAS_RIGHT)
            if MASK_MOD is not None:
                seen = seen & MASK_MOD(batch, head, offs_m[:, None], cols[None, :], shift,
                                       mod_args)
            qk = tl.where(seen, qk, float("-inf"))
        # A score hook may return -inf too: rows must survive seeing only -inf.
        p, acc, l_i, m_new = online_softmax_step(qk, m_i, l_i, acc, step_scale,
                                                 MASKED or (SCORE_MOD is not None), P_OFFSET,
                                                 row_offset)
        v = load_tile(v_ptrs, key_ok, offs_dv < HEAD_DIM_V, MASKED, HEAD_DIM_V != HEAD_DIM_V_PAD)
        if (v.dtype == tl.float8e4nv or v.dtype == tl.float8e5) and BLOCK_N < 32:
            # FP8 MMAs need K >= 32: a narrower key tile (inside a block mask's 16-key blocks)
            # multiplies P @ V in fp16, which holds every e4m3/e5m2 value and P <= 2^8 exactly.
            acc = tl.dot(p.to(tl.float16), v.to(tl.float16), acc)
        else:
            # FP8: P is rounded to e4m3 even when V is e5m2; e4m3's extra mantissa bit halves
            # the rounding error of P and the tensor cores take mixed FP8 operands.
            p = p.to(tl.float8e4nv) if v.dtype == tl.float8e5 else p.to(v.dtype)
            acc = tl.dot(p, v, acc)
        m_i = m_new
        if PAGE_SIZE == 0 and BLOCK_MASK_KV == 0:
            k_ptrs += BLOCK_N * stride_ks
            v_ptrs += BLOCK_N * stride_vs
    return acc, l_i, m_i, bad_page


@triton.jit
def attend_block_list(
    acc, l_i, m_i, bad_page, q, num_ptr, indices_ptr,
    k_base, v_base, stride_ks, stride_vs, stride_vd, block_table_row, num_pages,
    stride_k_page, stride_v_page,
    batch, head, offs_m, offs_n, offs_d, offs_dv, seqlen_k, shift, qk_scale, k_descale_row,
    stride_k_descale_t, mod_args,
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    HEAD_DIM_V_PAD: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
    SCORE_MOD: tl.constexpr, MASK_MOD: tl.constexpr, K_DESCALE_BLOCK: tl.constexpr,
    P_OFFSET: tl.constexpr, BLOCK_MASK_KV: tl.constexpr, SCORE_LINEAR: tl.constexpr = False,
):
    """The key blocks a block mask lists for this tile, BLOCK_MASK_KV keys each walked BLOCK_N
    at a time: partial ones (MASK_MOD set) all masked; full ones (MASK_MOD None) unmasked but
    for a last listed block that crosses the sequence end (lists are ascending)."""
    STEPS: tl.constexpr = BLOCK_MASK_KV // BLOCK_N
    count = tl.load(num_ptr)
    if MASK_MOD is None:
        crosses = 0
        if count > 0:
            last_end = (tl.load(indices_ptr + count - 1) + 1) * BLOCK_MASK_KV
            crosses = (last_end > seqlen_k).to(tl.int32)
        acc, l_i, m_i, bad_page = attend_key_blocks(
            acc, l_i, m_i, bad_page, q, 0, (count - crosses) * STEPS, indices_ptr, k_base, v_base,
            stride_ks, stride_vs, stride_vd, block_table_row, num_pages, stride_k_page,
            stride_v_page, batch, head, offs_m, offs_n, offs_d, offs_dv, seqlen_k, shift, 0, 0,
            qk_scale, k_descale_row, stride_k_descale_t, mod_args, HEAD_DIM, HEAD_DIM_V,
            HEAD_DIM_PAD, HEAD_DIM_V_PAD, BLOCK_N, False, False, False, PAGE_SIZE, SCORE_MOD, None,
            K_DESCALE_BLOCK, P_OFFSET, BLOCK_MASK_KV,
            SCORE_LINEAR=SCORE_LINEAR)
        acc, l_i, m_i, bad_page = attend_key_blocks(
            acc, l_i, m_i, bad_page, q, (count - crosses) * STEPS, count * STEPS, indices_ptr,
            k_base, v_base, stride_ks, stride_vs, stride_vd, block_table_row, num_pages,
            stride_k_page, stride_v_page, batch, head, offs_m, offs_n, offs_d, offs_dv, seqlen_k,
            shift, 0, 0, qk_scale, k_descale_row, stride_k_descale_t, mod_args, HEAD_DIM,
            HEAD_DIM_V, HEAD_DIM_PAD, HEAD_DIM_V_PAD, BLOCK_N, True, False, False, PAGE_SIZE,
            SCORE_MOD, None, K_DESCALE_BLOCK, P_OFFSET, BLOCK_MASK_KV,
            SCORE_LINEAR=SCORE_LINEAR)
    else:
        acc, l_i, m_i, bad_page = attend_key_blocks(
            acc, l_i, m_i, bad_page, q, 0, count * STEPS, indices_ptr, k_base, v_base, stride_ks,
            stride_vs, stride_vd, block_table_row, num_pages, stride_k_page, stride_v_page, batch,
            head, offs_m, offs_n, offs_d, offs_dv, seqlen_k, shift, 0, 0, qk_scale, k_descale_row,
            stride_k_descale_t, mod_args, HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD, HEAD_DIM_V_PAD,
            BLOCK_N, True, False, False, PAGE_SIZE, SCORE_MOD, MASK_MOD, K_DESCALE_BLOCK, P_OFFSET,
            BLOCK_MASK_KV, SCORE_LINEAR=SCORE_LINEAR)
    return acc, l_i, m_i, bad_page
