"""The two consumer warpgroups of the Gluon MLA decode kernels (sm90.py for a 16-bit cache,
sm90_fp8.py for e4m3); the state they share with the producer partitions is in sm90_state.py.
The consumers read Q and KV tiles that the kernel's producer partition put in shared memory,
and are generic in the tile size (Buffers.TILE_N: 64 keys for both caches today).

  * softmax warpgroup (the default partition, 4 warps, 256 registers): S_j = Q K_j^T over
    the 9 boxes (one copy of S: no duplicated QK^T), each wgmma issued once its box's ready
    barrier has fired, online softmax, and its half of the output, O[:, :256] ([64, 256]
    fp32, 128 registers a thread) += P_j V_j[:, :256] with P in registers, one wgmma of
    N = 256 (see _v_half). Software pipelined one tile deep: S_{j+1} is issued together with
    O += P_j V_j, and the softmax of tile j+1 runs while the tensor cores do that P V; or, with
    PV_FIRST, P V is issued first and the tile's stage released once it retires, before the
    softmax: the producer refills the stage a softmax earlier (where its loads bound the kernel).
    After each softmax it hands P_j (bf16/fp16) and the row rescale factor alpha_j to the
    other warpgroup through shared memory (one buffer, p_ready / p_empty mbarriers).
  * P V warpgroup (4 warps): O[:, 256:] = O * alpha_j + P_j V_j[:, 256:] with P read from
    shared memory by wgmma. A last message after the final tile carries 1 / l instead of alpha.
V is the first 512 columns of the K tile (boxes 0-7, in their own ring; box 8, rope, in a
second ring), used as an MN-major B operand.
Sending P_j before waiting for this warpgroup's own P V (so the other can start sooner) was
tried and spills a register (the shared-memory base) at 256 registers; not kept.

Tails: TMA reads whole tiles; the keys of a sequence's last tile past kv_end are in the same
page (allocated, but their contents are arbitrary, possibly NaN), so the softmax warpgroup
zeroes those rows in shared memory before the tile is used (0 * NaN would poison P V). Rows
of a block past H·q_len read zeros (TMA bounds of the [batch, rows, 576] q view) and are
never stored.

Scales: softmax_scale_log2 and output_scale may carry a factor that undoes a scaled widening
(sm90_fp8.py); with HAS_DESCALE the FP8 descale multiplies both. Pointer layouts are in the
kernels' docstrings (sm90.py, sm90_fp8.py).

No `from __future__ import annotations` here: Gluon checks aggregate fields against their
annotations, which must be classes, not strings.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait)
from triton.language.core import _aggregate as aggregate

from ..gluon_common import Scalar, online_softmax, scalar
from .sm90_state import (BLOCK_M, BOX, NUM_BOXES, V_BOXES, V_BOXES_PER_WG, Buffers, WorkItem,
                         box_view, planned_seq_len)


# ---------------------------------------------------------------------------------------------
# Softmax warpgroup
# ---------------------------------------------------------------------------------------------

@aggregate
class SoftmaxRows:
    """The softmax warpgroup's fixed state for one work item: the shared memory, the item's key
    range [kv_start, kv_end), each row's causal limit (row r sees keys < key_limit[r]), the
    scale of the scores (base 2), and the wgmma register layouts of S, O and P."""
    smem: Buffers
    kv_start: Scalar
    kv_end: Scalar
    key_limit: gl.tensor
    qk_scale: Scalar
    s_layout: gl.constexpr
    o_layout: gl.constexpr
    p_layout: gl.constexpr
    PV_FIRST: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, smem, kv_start, kv_end, key_limit, qk_scale, s_layout, o_layout,
                 p_layout, PV_FIRST):
        self.smem = smem
        self.kv_start = scalar(kv_start)
        self.kv_end = scalar(kv_end)
        self.key_limit = key_limit
        self.qk_scale = scalar(qk_scale)
        self.s_layout = gl.constexpr(s_layout)
        self.o_layout = gl.constexpr(o_layout)
        self.p_layout = gl.constexpr(p_layout)
        self.PV_FIRST = gl.constexpr(PV_FIRST)


@gluon.jit
def _issue_qk(smem, stage, phase, s_zero):
    """S = Q K^T for the tile in `stage`: 9 chained wgmmas, K = 64 each, each issued as soon
    as its box has landed."""
    mbarrier.wait(smem.ready(stage, 0), phase)
    s = warpgroup_mma(box_view(smem.q_smem, 0),
                      box_view(smem.kv_smem, stage * V_BOXES).permute((1, 0)), s_zero,
                      use_acc=False, is_async=True)
    for c in gl.static_range(1, V_BOXES):
        mbarrier.wait(smem.ready(stage, c), phase)
        s = warpgroup_mma(box_view(smem.q_smem, c),
                          box_view(smem.kv_smem, stage * V_BOXES + c).permute((1, 0)), s,
                          is_async=True)
    mbarrier.wait(smem.ready(stage, V_BOXES), phase)
    s = warpgroup_mma(box_view(smem.q_smem, V_BOXES),
                      box_view(smem.rope_smem, stage).permute((1, 0)), s, is_async=True)
    return s


@gluon.jit
def _v_half(kv_smem, stage, FIRST_BOX: gl.constexpr):
    """V[:, 64 FIRST_BOX : 64 FIRST_BOX + 256] of the tile in `stage` as one [64, 256] operand.
    Four consecutive [64, 64] boxes of 128-byte swizzle are exactly the layout of a [64, 256]
    NVMMA buffer (Triton's TMA lowering splits a [64, 256] box into those four copies, 8 KB
    apart), so the P V wgmma runs at N = 256: fewer instructions and less shared-memory
    traffic than 4 x N 64. The ring is reinterpreted as [2 NUM_STAGES, 64, 256] halves."""
    HALF_N: gl.constexpr = V_BOXES_PER_WG * BOX
    TILE_N: gl.constexpr = kv_smem.shape[2]
    v_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([TILE_N, HALF_N], kv_smem.dtype)
    halves = kv_smem._reinterpret(kv_smem.dtype,
                                  [kv_smem.shape[0] // V_BOXES_PER_WG, TILE_N, HALF_N], v_layout)
    return halves.index(stage * (V_BOXES // V_BOXES_PER_WG) + FIRST_BOX // V_BOXES_PER_WG)


@gluon.jit
def _issue_pv(p, kv_smem, stage, o, FIRST_BOX: gl.constexpr):
    """O += P V for this warpgroup's 256 V columns."""
    return warpgroup_mma(p, _v_half(kv_smem, stage, FIRST_BOX), o, is_async=True)


@gluon.jit
def _zero_tail_rows(smem, stage, valid_rows):
    """Zero the rows >= valid_rows of every box of a tile (keys past the sequence's end),
    then make the stores visible to the tensor cores."""
    zl: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    keep = gl.expand_dims(gl.arange(0, smem.TILE_N, layout=gl.SliceLayout(1, zl)) < valid_rows, 1)
    for c in gl.static_range(NUM_BOXES):
        if c < V_BOXES:
            buf = box_view(smem.kv_smem, stage * V_BOXES + c)
        else:
            buf = box_view(smem.rope_smem, stage)
        x = buf.load(zl)
        buf.store(gl.where(keep, x, gl.zeros_like(x)))
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _softmax_tile(s, m_i, l_i, tile_start, sw, MASKED: gl.constexpr):
    """Online softmax of one [64, TILE_N] score tile (base 2): (p, alpha, m_new, l_new)."""
    if MASKED:
        cols = gl.expand_dims(
            tile_start + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, sw.s_layout)), 0)
        visible = (cols < sw.kv_end) & (cols < gl.expand_dims(sw.key_limit, 1))
        s = gl.where(visible, s, float("-inf"))
    return online_softmax(s, m_i, l_i, sw.qk_scale, MASKED)


@gluon.jit
def _send_p(smem, p, alpha, count):
    """Message `count` to the P V warpgroup: P_count and alpha_count, once it has released
    the previous message (one buffer)."""
    mbarrier.wait(smem.p_empty, (count & 1) ^ 1)
    smem.p_smem.store(p)
    smem.alpha_smem.store(alpha)
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(smem.p_ready, count=1)


@gluon.jit
def _softmax_loop(o, p, m_i, l_i, prev_stage, j_start, j_end, sw, MASKED: gl.constexpr):
    """Tiles [j_start, j_end): S_j = Q K_j^T overlaps O += P_{j-1} V_{j-1}."""
    smem = sw.smem
    TILE_N: gl.constexpr = smem.TILE_N
    s_zero = gl.zeros([BLOCK_M, TILE_N], gl.float32, layout=sw.s_layout)
    for j in range(j_start, j_end):
        stage = j % smem.NUM_STAGES
        phase = (j // smem.NUM_STAGES) & 1
        tile_start = sw.kv_start + j * TILE_N
        if MASKED:
            if tile_start + TILE_N > sw.kv_end:
                smem.wait_tile(stage, phase)
                _zero_tail_rows(smem, stage, sw.kv_end - tile_start)
        if sw.PV_FIRST:
            # P V first: once it retires, the stage is released before S_j's softmax.
            o = _issue_pv(p, smem.kv_smem, prev_stage, o, 0)
            s = _issue_qk(smem, stage, phase, s_zero)
            o = warpgroup_mma_wait(1, deps=(o,))
            mbarrier.arrive(smem.kv_empty.index(prev_stage), count=1)
            s = warpgroup_mma_wait(0, deps=(s,))
            p_f32, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, tile_start, sw, MASKED)
        else:
            s = _issue_qk(smem, stage, phase, s_zero)
            o = _issue_pv(p, smem.kv_smem, prev_stage, o, 0)
            # wgmma groups retire in order: 1 left in flight means S_j is done, P V is not.
            s = warpgroup_mma_wait(1, deps=(s,))
            p_f32, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, tile_start, sw, MASKED)
            o = warpgroup_mma_wait(0, deps=(o,))
            mbarrier.arrive(smem.kv_empty.index(prev_stage), count=1)
        o = o * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, sw.o_layout)), 1)
        p_lo = p_f32.to(smem.p_smem.dtype)
        _send_p(smem, p_lo, alpha, j)
        p = gl.convert_layout(p_lo, sw.p_layout)
        prev_stage = stage
    return o, p, m_i, l_i, prev_stage


@gluon.jit
def _store_half(o, scale, rows, item, output, o_layout: gl.constexpr, FIRST_BOX: gl.constexpr):
    """Write this warpgroup's 256 output columns, scaled by `scale` per row."""
    o = o * gl.expand_dims(scale, 1)
    row_ok = gl.expand_dims(rows < output.num_rows, 1)
    cols = gl.expand_dims(FIRST_BOX * BOX + gl.arange(0, V_BOXES_PER_WG * BOX,
                                                      layout=gl.SliceLayout(0, o_layout)), 0)
    if item.slot < 0:
        token = rows // output.num_heads
        head = rows % output.num_heads
        dst = gl.expand_dims(output.out_ptr + item.batch.to(gl.int64) * output.stride_ob
                             + token.to(gl.int64) * output.stride_os
                             + head.to(gl.int64) * output.stride_oh, 1) + cols
        gl.store(dst, o.to(output.out_ptr.dtype.element_ty), mask=row_ok)
    else:
        slot_rows = item.slot.to(gl.int64) * output.num_rows + rows
        wsp = gl.expand_dims(output.partial_out_ptr + slot_rows * 512, 1) + cols
        gl.store(wsp, o, mask=row_ok)


@gluon.jit
def softmax_partition(work_ptr, smem, output, scores):
    """The softmax warpgroup (the default partition): S, the softmax, P to the other
    warpgroup, O[:, :256], and the LSE."""
    TILE_N: gl.constexpr = smem.TILE_N
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, TILE_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, V_BOXES_PER_WG * BOX, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

    item = WorkItem.load(work_ptr)
    kv_start = item.kv_start
    kv_end = item.kv_end
    seq_len = gl.load(scores.seq_lens_ptr + item.batch)
    rows = gl.program_id(0) * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_layout)
    # Speculative decoding: token j of q_len sees the first seq_len - q_len + 1 + j keys.
    first_limit = seq_len - scores.q_len + 1
    key_limit = first_limit + rows // output.num_heads
    num_tiles = gl.cdiv(kv_end - kv_start, TILE_N)
    # Tiles below full_end are visible to every row and inside the chunk: no masks there.
    full_end = gl.maximum(gl.minimum(kv_end, first_limit), kv_start)
    num_full = (full_end - kv_start) // TILE_N
    # output_scale (and the factor in softmax_scale_log2) undoes a scaled widening of an FP8
    # cache (sm90_fp8.py); an FP8 descale multiplies the scores and the output too.
    qk_scale = scores.softmax_scale_log2
    out_scale = scores.output_scale
    if scores.HAS_DESCALE:
        descale = gl.load(scores.kv_descale_ptr)
        qk_scale = qk_scale * descale
        out_scale = out_scale * descale
    # A plan made for other seq_lens would silently miss or mis-mask keys: its rows come out
    # NaN instead (through out_scale, finite otherwise), since a CUDA graph replay cannot raise.
    out_scale = gl.where(planned_seq_len(work_ptr) != seq_len, float("nan"), out_scale)
    # It waits in shared memory until the epilogue: one register fewer across the key loops
    # (the FP8 kernel's softmax spilled without it). _send_p's barriers order the reload.
    smem.scale_smem.store(gl.full([BLOCK_M], out_scale, gl.float32, layout=row_layout))
    sw = SoftmaxRows(smem, kv_start, kv_end, key_limit, qk_scale, s_layout, o_layout, p_layout,
                     scores.PV_FIRST)

    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_layout)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_layout)
    o = gl.zeros([BLOCK_M, V_BOXES_PER_WG * BOX], gl.float32, layout=o_layout)
    mbarrier.wait(smem.q_ready, 0)

    # Tile 0 is peeled (no previous P V to overlap) and always masked (once per item).
    if kv_start + TILE_N > kv_end:
        smem.wait_tile(0, 0)
        _zero_tail_rows(smem, 0, kv_end - kv_start)
    s = _issue_qk(smem, 0, 0, gl.zeros([BLOCK_M, TILE_N], gl.float32, layout=s_layout))
    s = warpgroup_mma_wait(0, deps=(s,))
    p_f32, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, kv_start, sw, True)
    p_lo = p_f32.to(smem.p_smem.dtype)
    _send_p(smem, p_lo, alpha, 0)
    p = gl.convert_layout(p_lo, p_layout)
    stage = 0
    o, p, m_i, l_i, stage = _softmax_loop(o, p, m_i, l_i, stage, 1, num_full, sw, False)
    o, p, m_i, l_i, stage = _softmax_loop(o, p, m_i, l_i, stage, gl.maximum(num_full, 1),
                                          num_tiles, sw, True)
    o = _issue_pv(p, smem.kv_smem, stage, o, 0)
    o = warpgroup_mma_wait(0, deps=(o,))
    mbarrier.arrive(smem.kv_empty.index(stage), count=1)

    # A row may see no key of a late chunk (its causal limit is below the chunk): output 0,
    # LSE -inf, which the combine weighs as 0. Every row sees key 0, so no final row is empty.
    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    out_scale = smem.scale_smem.load(row_layout)
    scale = out_scale / l_safe
    # The last message: 1 / l (times the FP8 descale) for the other half of the output.
    mbarrier.wait(smem.p_empty, (num_tiles & 1) ^ 1)
    smem.alpha_smem.store(scale)
    gl.thread_barrier()
    mbarrier.arrive(smem.p_ready, count=1)
    _store_half(o, gl.convert_layout(scale, gl.SliceLayout(1, o_layout)),
                gl.convert_layout(rows, gl.SliceLayout(1, o_layout)), item, output, o_layout, 0)
    lse = gl.where(l_i == 0.0, float("-inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)
    lse = lse + 0.0 * out_scale   # NaN for a stale plan
    if item.slot < 0:
        gl.store(output.lse_ptr + item.batch.to(gl.int64) * output.num_rows + rows, lse,
                 mask=rows < output.num_rows)
    else:
        gl.store(output.partial_lse_ptr + item.slot.to(gl.int64) * output.num_rows + rows, lse,
                 mask=rows < output.num_rows)


# ---------------------------------------------------------------------------------------------
# P V warpgroup
# ---------------------------------------------------------------------------------------------

@gluon.jit
def pv_partition(work_ptr, smem, output):
    """The P V warpgroup: O[:, 256:] from the P messages of the softmax warpgroup."""
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, V_BOXES_PER_WG * BOX, 16])
    row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    item = WorkItem.load(work_ptr)
    num_tiles = gl.cdiv(item.kv_end - item.kv_start, smem.TILE_N)
    o = gl.zeros([BLOCK_M, V_BOXES_PER_WG * BOX], gl.float32, layout=o_layout)
    for j in range(num_tiles):
        stage = j % smem.NUM_STAGES
        for c in gl.static_range(V_BOXES_PER_WG, V_BOXES):
            mbarrier.wait(smem.ready(stage, c), (j // smem.NUM_STAGES) & 1)
        mbarrier.wait(smem.p_ready, j & 1)
        o = o * gl.expand_dims(smem.alpha_smem.load(row_layout), 1)
        o = _issue_pv(smem.p_smem, smem.kv_smem, stage, o, V_BOXES_PER_WG)
        o = warpgroup_mma_wait(0, deps=(o,))
        mbarrier.arrive(smem.p_empty, count=1)
        mbarrier.arrive(smem.kv_empty.index(stage), count=1)
    mbarrier.wait(smem.p_ready, num_tiles & 1)
    scale = smem.alpha_smem.load(row_layout)
    rows = gl.program_id(0) * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_layout)
    _store_half(o, scale, rows, item, output, o_layout, V_BOXES_PER_WG)
