"""The consumer side of the Hopper attention kernel (attention_sm90.py): two warpgroups that
run S = Q K^T and O += P V on wgmma over the K/V rings the loader fills, the online softmax
between them, and the epilogue. Also the work-item decoding that loader and consumers share.

What is here, top to bottom: the wgmma operand views of the ring buffers and of P; the turn
barriers of the ping-pong consumers; the key loops in their two shapes (16-bit carries P across
iterations, FP8 carries S: _attend_tile says why); the consumer partition with its epilogue.
Pointer layouts are in attention_sm90.py's docstring.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier, warpgroup_mma, warpgroup_mma_wait)

from ..gluon_common import online_softmax


@gluon.jit
def _tile_coords(tile_ids_ptr, t, num_m_blocks, num_q_heads, gqa_group_size, seqlen_q, seqlen_k,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """Decode work item t; return its coordinates and key-block counts (all + unmasked)."""
    tile = gl.load(tile_ids_ptr + t)
    m_block = tile % num_m_blocks
    batch_head = tile // num_m_blocks
    batch = batch_head // num_q_heads
    head = batch_head % num_q_heads
    kv_head = head // gqa_group_size
    # Query i sees keys j <= i + causal_shift (bottom-right aligned when seqlen_q != seqlen_k).
    causal_shift = seqlen_k - seqlen_q
    if CAUSAL:
        key_end = gl.maximum(gl.minimum(seqlen_k, (m_block + 1) * BLOCK_M + causal_shift), 0)
        first_row_sees = gl.minimum(m_block * BLOCK_M + causal_shift + 1, seqlen_k)
        num_full = gl.maximum(first_row_sees, 0) // BLOCK_N
    else:
        key_end = seqlen_k
        num_full = seqlen_k // BLOCK_N
    num_blocks = gl.cdiv(key_end, BLOCK_N)
    return m_block, batch, head, kv_head, num_blocks, num_full


@gluon.jit
def _k_operand(k_smem, stage, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr):
    """K^T [HEAD_DIM, BLOCK_N] as a K-major view of the [BLOCK_N, HEAD_DIM] tile."""
    return k_smem.index(stage).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))


@gluon.jit
def _v_operand(v_smem, stage, BLOCK_N: gl.constexpr, HEAD_DIM_V: gl.constexpr):
    """V [BLOCK_N, HEAD_DIM_V] (V's padded head dim): the row-major tile itself."""
    return v_smem.index(stage).reshape([BLOCK_N, HEAD_DIM_V])


@gluon.jit
def _p_operand(p_f32, P_DTYPE: gl.constexpr, p_layout: gl.constexpr):
    """P as the register A operand of P @ V."""
    return gl.convert_layout(p_f32.to(P_DTYPE), p_layout)


@gluon.jit
def _wait_turn(turn_bars, turn_count, HALF: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong: warpgroup HALF issues its n-th GEMMs after the other has issued its
    (n-1)-th (HALF 0) or n-th (HALF 1), so one's softmax runs under the other's GEMMs."""
    if PINGPONG:
        mbarrier.wait(turn_bars.index(HALF), (turn_count & 1) ^ (1 - HALF))
    return turn_count + 1


@gluon.jit
def _pass_turn(turn_bars, HALF: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turn_bars.index(1 - HALF), count=1)


@gluon.jit
def _softmax_update(s, m_i, l_i, qk_scale, rows, key_start, seqlen_k, causal_shift,
                    s_layout: gl.constexpr, BLOCK_N: gl.constexpr,
                    MASKED: gl.constexpr, CAUSAL: gl.constexpr):
    """Online softmax of one score block: returns (p, alpha, m_new, l_new)."""
    if MASKED:
        cols = key_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        visible = gl.expand_dims(cols, 0) < seqlen_k
        if CAUSAL:
            visible = visible & (gl.expand_dims(cols, 0) <= gl.expand_dims(rows, 1) + causal_shift)
        s = gl.where(visible, s, float("-inf"))
    return online_softmax(s, m_i, l_i, qk_scale, MASKED)


@gluon.jit
def _key_blocks_carry_p(acc, p, m_i, l_i, kv_count, prev_stage, prev_phase, turn_count, q_op,
                        k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, turn_bars,
                        block_start, block_end, qk_scale, rows, seqlen_k, causal_shift,
                        s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr,
                        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                        HEAD_DIM_V: gl.constexpr,
                        NUM_STAGES: gl.constexpr, P_DTYPE: gl.constexpr,
                        MASKED: gl.constexpr, CAUSAL: gl.constexpr,
                        HALF: gl.constexpr, PINGPONG: gl.constexpr):
    """Key blocks [block_start, block_end): S_j = Q K_j^T overlaps O += P_{j-1} V_{j-1}.
    The loop carries P_{j-1}."""
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    for j in range(block_start, block_end):
        stage = kv_count % NUM_STAGES
        phase = (kv_count // NUM_STAGES) & 1
        mbarrier.wait(k_ready.index(stage), phase)
        mbarrier.wait(v_ready.index(prev_stage), prev_phase)
        turn_count = _wait_turn(turn_bars, turn_count, HALF, PINGPONG)
        s = warpgroup_mma(q_op, _k_operand(k_smem, stage, BLOCK_N, HEAD_DIM), s_zero,
                          use_acc=False, is_async=True)
        acc = warpgroup_mma(p, _v_operand(v_smem, prev_stage, BLOCK_N, HEAD_DIM_V), acc,
                            is_async=True)
        _pass_turn(turn_bars, HALF, PINGPONG)
        # wgmma groups retire in order: one left in flight means S_j is done, P V is not.
        s = warpgroup_mma_wait(1, deps=(s,))
        mbarrier.arrive(k_empty.index(stage), count=1)
        p_f32, alpha, m_i, l_i = _softmax_update(s, m_i, l_i, qk_scale, rows, j * BLOCK_N,
                                                 seqlen_k, causal_shift, s_layout, BLOCK_N,
                                                 MASKED, CAUSAL)
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(v_empty.index(prev_stage), count=1)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
        p = _p_operand(p_f32, P_DTYPE, p_layout)
        prev_stage = stage
        prev_phase = phase
        kv_count += 1
    return acc, p, m_i, l_i, kv_count, prev_stage, prev_phase, turn_count


@gluon.jit
def _first_s(kv_count, turn_count, q_op, k_smem, k_ready, k_empty, turn_bars,
             s_layout: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
             HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, HALF: gl.constexpr,
             PINGPONG: gl.constexpr):
    """S_0 of a tile, alone (nothing to overlap it with): (s, its ring slot and phase, turn)."""
    stage = kv_count % NUM_STAGES
    phase = (kv_count // NUM_STAGES) & 1
    mbarrier.wait(k_ready.index(stage), phase)
    turn_count = _wait_turn(turn_bars, turn_count, HALF, PINGPONG)
    s = warpgroup_mma(q_op, _k_operand(k_smem, stage, BLOCK_N, HEAD_DIM),
                      gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout),
                      use_acc=False, is_async=True)
    _pass_turn(turn_bars, HALF, PINGPONG)
    s = warpgroup_mma_wait(0, deps=(s,))
    mbarrier.arrive(k_empty.index(stage), count=1)
    return s, stage, phase, turn_count


@gluon.jit
def _last_pv(acc, p, stage, phase, turn_count, v_smem, v_ready, v_empty, turn_bars,
             BLOCK_N: gl.constexpr, HEAD_DIM_V: gl.constexpr,
             HALF: gl.constexpr, PINGPONG: gl.constexpr):
    """O += P V for a tile's last block, alone, waited for: (acc, turn)."""
    mbarrier.wait(v_ready.index(stage), phase)
    turn_count = _wait_turn(turn_bars, turn_count, HALF, PINGPONG)
    acc = warpgroup_mma(p, _v_operand(v_smem, stage, BLOCK_N, HEAD_DIM_V), acc,
                        is_async=True)
    _pass_turn(turn_bars, HALF, PINGPONG)
    acc = warpgroup_mma_wait(0, deps=(acc,))
    mbarrier.arrive(v_empty.index(stage), count=1)
    return acc, turn_count


@gluon.jit
def _attend_tile(acc, m_i, l_i, kv_count, turn_count, q_op, k_smem, v_smem, q_empty,
                         k_ready, k_empty, v_ready, v_empty, turn_bars, num_blocks, num_full,
                         qk_scale, rows, seqlen_k, causal_shift,
                         s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr,
                         ROWS: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                         HEAD_DIM_V: gl.constexpr, NUM_STAGES: gl.constexpr,
                         P_DTYPE: gl.constexpr, CAUSAL: gl.constexpr,
                         HALF: gl.constexpr, PINGPONG: gl.constexpr):
    """The key blocks of one tile (num_blocks >= 1), the loop carrying P (block 0 peeled);
    releases Q after its last S."""
    # Block 0 is peeled: it has no previous P V to overlap with. Masked always (cheap,
    # once per tile) so that tiles whose first block crosses the diagonal need no branch.
    s, stage, phase, turn_count = _first_s(kv_count, turn_count, q_op, k_smem, k_ready, k_empty,
                                           turn_bars, s_layout, ROWS, BLOCK_N, HEAD_DIM,
                                           NUM_STAGES, HALF, PINGPONG)
    p_f32, alpha, m_i, l_i = _softmax_update(s, m_i, l_i, qk_scale, rows, 0, seqlen_k,
                                             causal_shift, s_layout, BLOCK_N, True, CAUSAL)
    p = _p_operand(p_f32, P_DTYPE, p_layout)
    kv_count += 1
    acc, p, m_i, l_i, kv_count, stage, phase, turn_count = _key_blocks_carry_p(
        acc, p, m_i, l_i, kv_count, stage, phase, turn_count, q_op,
        k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, turn_bars,
        1, num_full, qk_scale, rows, seqlen_k, causal_shift,
        s_layout, o_layout, p_layout, ROWS, BLOCK_N, HEAD_DIM, HEAD_DIM_V, NUM_STAGES,
        P_DTYPE, False, CAUSAL, HALF, PINGPONG)
    acc, p, m_i, l_i, kv_count, stage, phase, turn_count = _key_blocks_carry_p(
        acc, p, m_i, l_i, kv_count, stage, phase, turn_count, q_op,
        k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, turn_bars,
        gl.maximum(num_full, 1), num_blocks, qk_scale, rows, seqlen_k, causal_shift,
        s_layout, o_layout, p_layout, ROWS, BLOCK_N, HEAD_DIM, HEAD_DIM_V, NUM_STAGES,
        P_DTYPE, True, CAUSAL, HALF, PINGPONG)
    # Q is free once the last S is computed: the loader may fetch the next tile's Q
    # while the last P V and the epilogue run.
    mbarrier.arrive(q_empty, count=1)
    acc, turn_count = _last_pv(acc, p, stage, phase, turn_count, v_smem, v_ready, v_empty,
                               turn_bars, BLOCK_N, HEAD_DIM_V, HALF, PINGPONG)
    return acc, m_i, l_i, kv_count, turn_count


@gluon.jit
def _consumer_partition(tile_ids_ptr, tile_starts_ptr, num_m_blocks, num_q_heads, gqa_group_size,
                        seqlen_q, seqlen_k, softmax_scale_log2,
                        out_ptr, stride_ob, stride_os, stride_oh, lse_ptr,
                        q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
                        turn_bars, HALF: gl.constexpr, PINGPONG: gl.constexpr,
                        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                        OUT_DIM: gl.constexpr,
                        NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                        RETURN_LSE: gl.constexpr, ROWS: gl.constexpr):
    """Rows [HALF * ROWS, (HALF + 1) * ROWS) of each BLOCK_M tile, on ROWS // 16 warps.
    HEAD_DIM: Q/K's head dim padded to a power of two (TMA zero-fills the padding); V's padded
    head dim is its tile's; OUT_DIM: V's head dim, the output columns stored."""
    NUM_WARPS: gl.constexpr = ROWS // 16
    HEAD_DIM_V: gl.constexpr = v_smem.shape[4]
    dtype: gl.constexpr = q_smem.dtype
    P_DTYPE: gl.constexpr = dtype
    K_WIDTH: gl.constexpr = 32 // dtype.primitive_bitwidth
    INSTR_K: gl.constexpr = 256 // dtype.primitive_bitwidth
    # Warps tile the rows: each warpgroup owns 64 contiguous query rows of the tile.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[NUM_WARPS, 1], instr_shape=[16, BLOCK_N, INSTR_K])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[NUM_WARPS, 1], instr_shape=[16, HEAD_DIM_V, INSTR_K])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=K_WIDTH)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    q_op = q_smem.reshape([BLOCK_M, HEAD_DIM]).slice(HALF * ROWS, ROWS)
    causal_shift = seqlen_k - seqlen_q

    kv_count = 0
    tile_count = 0
    turn_count = 0
    for t in range(gl.load(tile_starts_ptr + gl.program_id(0)),
                   gl.load(tile_starts_ptr + gl.program_id(0) + 1)):
        m_block, batch, head, kv_head, num_blocks, num_full = _tile_coords(
            tile_ids_ptr, t, num_m_blocks, num_q_heads, gqa_group_size, seqlen_q, seqlen_k,
            BLOCK_M, BLOCK_N, CAUSAL)
        qk_scale = softmax_scale_log2
        rows = m_block * BLOCK_M + HALF * ROWS + gl.arange(0, ROWS, layout=row_layout)

        m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=row_layout)
        l_i = gl.zeros([ROWS], gl.float32, layout=row_layout)
        acc = gl.zeros([ROWS, HEAD_DIM_V], gl.float32, layout=o_layout)
        mbarrier.wait(q_ready, tile_count & 1)
        if num_blocks > 0:
            acc, m_i, l_i, kv_count, turn_count = _attend_tile(
                acc, m_i, l_i, kv_count, turn_count, q_op, k_smem, v_smem, q_empty,
                k_ready, k_empty, v_ready, v_empty, turn_bars, num_blocks, num_full,
                qk_scale, rows, seqlen_k, causal_shift, s_layout, o_layout, p_layout,
                ROWS, BLOCK_N, HEAD_DIM, HEAD_DIM_V, NUM_STAGES, P_DTYPE, CAUSAL,
                HALF, PINGPONG)
        else:
            mbarrier.arrive(q_empty, count=1)

        # Rows that see no key at all (seqlen_q > seqlen_k under causal) output 0, lse -inf.
        l_safe = gl.where(l_i == 0.0, 1.0, l_i)
        acc = acc * gl.expand_dims(gl.convert_layout(1.0 / l_safe, gl.SliceLayout(1, o_layout)), 1)
        out_rows = m_block * BLOCK_M + HALF * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, o_layout))
        out_cols = gl.arange(0, HEAD_DIM_V, layout=gl.SliceLayout(0, o_layout))
        out_ptrs = (out_ptr + batch.to(gl.int64) * stride_ob + head.to(gl.int64) * stride_oh
                    + gl.expand_dims(out_rows.to(gl.int64) * stride_os, 1)
                    + gl.expand_dims(out_cols, 0))
        out_mask = gl.expand_dims(out_rows < seqlen_q, 1)
        if OUT_DIM != HEAD_DIM_V:
            out_mask = out_mask & gl.expand_dims(out_cols < OUT_DIM, 0)
        gl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
        if RETURN_LSE:
            lse = gl.where(l_i == 0.0, float("-inf"),
                           (m_i + gl.log2(l_safe)) * 0.6931471805599453)
            batch_head = batch * num_q_heads + head
            gl.store(lse_ptr + batch_head.to(gl.int64) * seqlen_q + rows, lse, mask=rows < seqlen_q)
        tile_count += 1
