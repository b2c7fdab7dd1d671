"""The two consumer warpgroups of the Gluon MLA decode kernels (mla_sm90.py for a 16-bit cache,
mla_sm90_fp8.py for e4m3), with what both kernels share: the shared-memory state
(allocate_state) and the Q load of their producer partitions (load_q). The consumers read Q
and KV tiles that the kernel's producer partition put in shared memory, and are generic in the
tile size (64 keys for the 16-bit cache, 32 for e4m3: taken from the ring's shape).

  * softmax warpgroup (the default partition, 4 warps, 256 registers): S_j = Q K_j^T over
    the 9 boxes (one copy of S: no duplicated QK^T), each wgmma issued once its box's ready
    barrier has fired, online softmax, and its half of the output, O[:, :256] ([64, 256]
    fp32, 128 registers a thread) += P_j V_j[:, :256] with P in registers, one wgmma of
    N = 256 (see _v_half). Software pipelined one tile deep: S_{j+1} is issued together with
    O += P_j V_j, and the softmax of tile j+1 runs while the tensor cores do that P V.
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
(mla_sm90_fp8.py); with HAS_DESCALE the FP8 descale multiplies both.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from ..gluon_common import online_softmax

BLOCK_M = gl.constexpr(64)            # rows per program: one wgmma M per warpgroup
BOX = gl.constexpr(64)                # TMA box width (columns); 576 = 9 boxes, V = boxes 0-7
NUM_BOXES = gl.constexpr(9)
V_BOXES = gl.constexpr(8)
V_BOXES_PER_WG = gl.constexpr(4)      # each consumer warpgroup owns 256 of V's 512 columns
LOG2_E = 1.4426950408889634


@gluon.jit
def allocate_state(q_desc, NUM_STAGES: gl.constexpr, TILE_N: gl.constexpr):
    """Shared memory of both kernels: Q (9 boxes), the ring of NUM_STAGES 16-bit KV tiles of
    TILE_N keys (boxes 0-7, the 512 latent columns that are also V, and box 8, rope, apart
    because shared buffers need power-of-two inner dims), the P message (P and one fp32 per
    row), and their barriers: q_ready, p_ready / p_empty, one kv_ready per box, kv_empty."""
    dtype: gl.constexpr = q_desc.dtype
    tile_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, TILE_N, BOX], dtype)
    q_smem = gl.allocate_shared_memory(dtype, [NUM_BOXES] + q_desc.block_type.shape, q_desc.layout)
    kv_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES * V_BOXES, 1, TILE_N, BOX], tile_layout)
    rope_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, TILE_N, BOX], tile_layout)
    p_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, TILE_N],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_M, TILE_N], dtype))
    alpha_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_M],
                                           gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    p_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES * NUM_BOXES, 1],
                                         mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)
    mbarrier.init(p_ready, count=1)
    mbarrier.init(p_empty, count=1)
    for i in gl.static_range(NUM_STAGES):
        for c in gl.static_range(NUM_BOXES):
            mbarrier.init(kv_ready.index(i * NUM_BOXES + c), count=1)
        mbarrier.init(kv_empty.index(i), count=2)   # both consumer warpgroups release a tile
    return (q_smem, kv_smem, rope_smem, p_smem, alpha_smem, q_ready, p_ready, p_empty, kv_ready,
            kv_empty)


@gluon.jit
def load_q(q_desc, q_smem, q_ready, batch):
    """TMA of this program's 64 rows of Q (9 boxes, one barrier), from the producer."""
    mbarrier.expect(q_ready, NUM_BOXES * q_desc.block_type.nbytes)
    for c in gl.static_range(NUM_BOXES):
        tma.async_copy_global_to_shared(q_desc, [batch, gl.program_id(0) * BLOCK_M, c * BOX],
                                        q_ready, q_smem.index(c))


@gluon.jit
def work_item(work_ptr):
    """This program's work item (tileattn.scheduler.mla: WORK_FIELDS = 5 columns); the fifth,
    the seq_len the plan was made for, is read by planned_seq_len."""
    work_id = gl.program_id(1)
    batch = gl.load(work_ptr + work_id * 5)
    kv_start = gl.load(work_ptr + work_id * 5 + 1)
    kv_end = gl.load(work_ptr + work_id * 5 + 2)
    slot = gl.load(work_ptr + work_id * 5 + 3)
    return batch, kv_start, kv_end, slot


@gluon.jit
def planned_seq_len(work_ptr):
    return gl.load(work_ptr + gl.program_id(1) * 5 + 4)


@gluon.jit
def box_view(smem, i):
    """Box i of a [n, 1, rows, 64] buffer as a [rows, 64] tile."""
    return smem.index(i).reshape([smem.shape[2], smem.shape[3]])


@gluon.jit
def _wait_tile(kv_ready, stage, phase):
    for c in gl.static_range(NUM_BOXES):
        mbarrier.wait(kv_ready.index(stage * NUM_BOXES + c), phase)


@gluon.jit
def _issue_qk(q_smem, kv_smem, rope_smem, kv_ready, stage, phase, s_zero):
    """S = Q K^T for the tile in `stage`: 9 chained wgmmas, K = 64 each, each issued as soon
    as its box has landed."""
    mbarrier.wait(kv_ready.index(stage * NUM_BOXES), phase)
    s = warpgroup_mma(box_view(q_smem, 0), box_view(kv_smem, stage * V_BOXES).permute((1, 0)), s_zero,
                      use_acc=False, is_async=True)
    for c in gl.static_range(1, V_BOXES):
        mbarrier.wait(kv_ready.index(stage * NUM_BOXES + c), phase)
        s = warpgroup_mma(box_view(q_smem, c), box_view(kv_smem, stage * V_BOXES + c).permute((1, 0)), s,
                          is_async=True)
    mbarrier.wait(kv_ready.index(stage * NUM_BOXES + V_BOXES), phase)
    s = warpgroup_mma(box_view(q_smem, V_BOXES), box_view(rope_smem, stage).permute((1, 0)), s,
                      is_async=True)
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
    halves = kv_smem._reinterpret(kv_smem.dtype, [kv_smem.shape[0] // V_BOXES_PER_WG, TILE_N, HALF_N],
                                  v_layout)
    return halves.index(stage * (V_BOXES // V_BOXES_PER_WG) + FIRST_BOX // V_BOXES_PER_WG)


@gluon.jit
def _issue_pv(p, kv_smem, stage, o, FIRST_BOX: gl.constexpr):
    """O += P V for this warpgroup's 256 V columns."""
    return warpgroup_mma(p, _v_half(kv_smem, stage, FIRST_BOX), o, is_async=True)


@gluon.jit
def _zero_tail_rows(kv_smem, rope_smem, stage, valid_rows):
    """Zero the rows >= valid_rows of every box of a tile (keys past the sequence's end),
    then make the stores visible to the tensor cores."""
    zl: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    keep = gl.expand_dims(gl.arange(0, kv_smem.shape[2], layout=gl.SliceLayout(1, zl)) < valid_rows, 1)
    for c in gl.static_range(NUM_BOXES):
        if c < V_BOXES:
            buf = box_view(kv_smem, stage * V_BOXES + c)
        else:
            buf = box_view(rope_smem, stage)
        x = buf.load(zl)
        buf.store(gl.where(keep, x, gl.zeros_like(x)))
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _softmax_tile(s, m_i, l_i, qk_scale, tile_start, kv_end, key_limit,
                  s_layout: gl.constexpr, MASKED: gl.constexpr):
    """Online softmax of one [64, TILE_N] score tile (base 2): (p, alpha, m_new, l_new)."""
    if MASKED:
        cols = gl.expand_dims(tile_start + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s_layout)), 0)
        visible = (cols < kv_end) & (cols < gl.expand_dims(key_limit, 1))
        s = gl.where(visible, s, float("-inf"))
    return online_softmax(s, m_i, l_i, qk_scale, MASKED)


@gluon.jit
def _send_p(p_smem, alpha_smem, p_ready, p_empty, p, alpha, count):
    """Message `count` to the P V warpgroup: P_count and alpha_count, once it has released
    the previous message (one buffer)."""
    mbarrier.wait(p_empty, (count & 1) ^ 1)
    p_smem.store(p)
    alpha_smem.store(alpha)
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(p_ready, count=1)


@gluon.jit
def _softmax_loop(o, p, m_i, l_i, prev_stage, q_smem, kv_smem, rope_smem, p_smem, alpha_smem,
                  kv_ready, kv_empty, p_ready, p_empty, j_start, j_end, kv_start, kv_end,
                  key_limit, qk_scale, s_layout: gl.constexpr, o_layout: gl.constexpr,
                  p_layout: gl.constexpr, NUM_STAGES: gl.constexpr, MASKED: gl.constexpr):
    """Tiles [j_start, j_end): S_j = Q K_j^T overlaps O += P_{j-1} V_{j-1}."""
    TILE_N: gl.constexpr = kv_smem.shape[2]
    s_zero = gl.zeros([BLOCK_M, TILE_N], gl.float32, layout=s_layout)
    for j in range(j_start, j_end):
        stage = j % NUM_STAGES
        phase = (j // NUM_STAGES) & 1
        tile_start = kv_start + j * TILE_N
        if MASKED:
            if tile_start + TILE_N > kv_end:
                _wait_tile(kv_ready, stage, phase)
                _zero_tail_rows(kv_smem, rope_smem, stage, kv_end - tile_start)
        s = _issue_qk(q_smem, kv_smem, rope_smem, kv_ready, stage, phase, s_zero)
        o = _issue_pv(p, kv_smem, prev_stage, o, 0)
        # wgmma groups retire in order: 1 left in flight means S_j is done, P V is not.
        s = warpgroup_mma_wait(1, deps=(s,))
        p_f32, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, qk_scale, tile_start, kv_end,
                                               key_limit, s_layout, MASKED)
        o = warpgroup_mma_wait(0, deps=(o,))
        mbarrier.arrive(kv_empty.index(prev_stage), count=1)
        o = o * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
        p_lo = p_f32.to(p_smem.dtype)
        _send_p(p_smem, alpha_smem, p_ready, p_empty, p_lo, alpha, j)
        p = gl.convert_layout(p_lo, p_layout)
        prev_stage = stage
    return o, p, m_i, l_i, prev_stage


@gluon.jit
def _store_half(o, scale, rows, batch, slot, num_heads, num_rows,
                out_ptr, stride_ob, stride_os, stride_oh, partial_out_ptr,
                o_layout: gl.constexpr, FIRST_BOX: gl.constexpr):
    """Write this warpgroup's 256 output columns, scaled by `scale` per row."""
    o = o * gl.expand_dims(scale, 1)
    row_ok = gl.expand_dims(rows < num_rows, 1)
    cols = gl.expand_dims(FIRST_BOX * BOX + gl.arange(0, V_BOXES_PER_WG * BOX,
                                                      layout=gl.SliceLayout(0, o_layout)), 0)
    if slot < 0:
        token = rows // num_heads
        head = rows % num_heads
        dst = gl.expand_dims(out_ptr + batch.to(gl.int64) * stride_ob + token.to(gl.int64) * stride_os
                             + head.to(gl.int64) * stride_oh, 1) + cols
        gl.store(dst, o.to(out_ptr.dtype.element_ty), mask=row_ok)
    else:
        slot_rows = slot.to(gl.int64) * num_rows + rows
        wsp = gl.expand_dims(partial_out_ptr + slot_rows * 512, 1) + cols
        gl.store(wsp, o, mask=row_ok)


@gluon.jit
def softmax_partition(work_ptr, seq_lens_ptr, out_ptr, lse_ptr, partial_out_ptr, partial_lse_ptr,
                       stride_ob, stride_os, stride_oh, num_heads, q_len, num_rows,
                       softmax_scale_log2, output_scale, kv_descale_ptr, q_smem, kv_smem,
                       rope_smem, p_smem,
                       alpha_smem, q_ready, kv_ready, kv_empty, p_ready, p_empty,
                       NUM_STAGES: gl.constexpr, HAS_DESCALE: gl.constexpr):
    TILE_N: gl.constexpr = kv_smem.shape[2]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, TILE_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, V_BOXES_PER_WG * BOX, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

    batch, kv_start, kv_end, slot = work_item(work_ptr)
    seq_len = gl.load(seq_lens_ptr + batch)
    rows = gl.program_id(0) * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_layout)
    # Speculative decoding: token j of q_len sees the first seq_len - q_len + 1 + j keys.
    first_limit = seq_len - q_len + 1
    key_limit = first_limit + rows // num_heads
    num_tiles = gl.cdiv(kv_end - kv_start, TILE_N)
    # Tiles below full_end are visible to every row and inside the chunk: no masks there.
    full_end = gl.maximum(gl.minimum(kv_end, first_limit), kv_start)
    num_full = (full_end - kv_start) // TILE_N
    # output_scale (and the factor in softmax_scale_log2) undoes a scaled widening of an FP8
    # cache (mla_sm90_fp8.py); an FP8 descale multiplies the scores and the output too.
    qk_scale = softmax_scale_log2
    out_scale = output_scale
    if HAS_DESCALE:
        descale = gl.load(kv_descale_ptr)
        qk_scale = qk_scale * descale
        out_scale = out_scale * descale
    # A plan made for other seq_lens would silently miss or mis-mask keys: its rows come out
    # NaN instead (through out_scale, finite otherwise), since a CUDA graph replay cannot raise.
    out_scale = gl.where(planned_seq_len(work_ptr) != seq_len, float("nan"), out_scale)

    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_layout)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_layout)
    o = gl.zeros([BLOCK_M, V_BOXES_PER_WG * BOX], gl.float32, layout=o_layout)
    mbarrier.wait(q_ready, 0)

    # Tile 0 is peeled (no previous P V to overlap) and always masked (once per item).
    if kv_start + TILE_N > kv_end:
        _wait_tile(kv_ready, 0, 0)
        _zero_tail_rows(kv_smem, rope_smem, 0, kv_end - kv_start)
    s = _issue_qk(q_smem, kv_smem, rope_smem, kv_ready, 0, 0,
                  gl.zeros([BLOCK_M, TILE_N], gl.float32, layout=s_layout))
    s = warpgroup_mma_wait(0, deps=(s,))
    p_f32, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, qk_scale, kv_start, kv_end, key_limit,
                                           s_layout, True)
    p_lo = p_f32.to(p_smem.dtype)
    _send_p(p_smem, alpha_smem, p_ready, p_empty, p_lo, alpha, 0)
    p = gl.convert_layout(p_lo, p_layout)
    stage = 0
    o, p, m_i, l_i, stage = _softmax_loop(
        o, p, m_i, l_i, stage, q_smem, kv_smem, rope_smem, p_smem, alpha_smem,
        kv_ready, kv_empty, p_ready, p_empty, 1, num_full, kv_start, kv_end, key_limit, qk_scale,
        s_layout, o_layout, p_layout, NUM_STAGES, False)
    o, p, m_i, l_i, stage = _softmax_loop(
        o, p, m_i, l_i, stage, q_smem, kv_smem, rope_smem, p_smem, alpha_smem,
        kv_ready, kv_empty, p_ready, p_empty, gl.maximum(num_full, 1), num_tiles, kv_start,
        kv_end, key_limit, qk_scale, s_layout, o_layout, p_layout, NUM_STAGES, True)
    o = _issue_pv(p, kv_smem, stage, o, 0)
    o = warpgroup_mma_wait(0, deps=(o,))
    mbarrier.arrive(kv_empty.index(stage), count=1)

    # A row may see no key of a late chunk (its causal limit is below the chunk): output 0,
    # LSE -inf, which the combine weighs as 0. Every row sees key 0, so no final row is empty.
    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    scale = out_scale / l_safe
    # The last message: 1 / l (times the FP8 descale) for the other half of the output.
    mbarrier.wait(p_empty, (num_tiles & 1) ^ 1)
    alpha_smem.store(scale)
    gl.thread_barrier()
    mbarrier.arrive(p_ready, count=1)
    _store_half(o, gl.convert_layout(scale, gl.SliceLayout(1, o_layout)),
                gl.convert_layout(rows, gl.SliceLayout(1, o_layout)), batch, slot, num_heads,
                num_rows, out_ptr, stride_ob, stride_os, stride_oh, partial_out_ptr, o_layout, 0)
    lse = gl.where(l_i == 0.0, float("-inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)
    lse = lse + 0.0 * out_scale   # NaN for a stale plan
    if slot < 0:
        gl.store(lse_ptr + batch.to(gl.int64) * num_rows + rows, lse, mask=rows < num_rows)
    else:
        gl.store(partial_lse_ptr + slot.to(gl.int64) * num_rows + rows, lse, mask=rows < num_rows)


@gluon.jit
def pv_partition(work_ptr, out_ptr, partial_out_ptr, stride_ob, stride_os, stride_oh,
                  num_heads, num_rows, kv_smem, p_smem, alpha_smem,
                  kv_ready, kv_empty, p_ready, p_empty, NUM_STAGES: gl.constexpr):
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, V_BOXES_PER_WG * BOX, 16])
    row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    batch, kv_start, kv_end, slot = work_item(work_ptr)
    num_tiles = gl.cdiv(kv_end - kv_start, kv_smem.shape[2])
    o = gl.zeros([BLOCK_M, V_BOXES_PER_WG * BOX], gl.float32, layout=o_layout)
    for j in range(num_tiles):
        stage = j % NUM_STAGES
        for c in gl.static_range(V_BOXES_PER_WG, V_BOXES):
            mbarrier.wait(kv_ready.index(stage * NUM_BOXES + c), (j // NUM_STAGES) & 1)
        mbarrier.wait(p_ready, j & 1)
        o = o * gl.expand_dims(alpha_smem.load(row_layout), 1)
        o = _issue_pv(p_smem, kv_smem, stage, o, V_BOXES_PER_WG)
        o = warpgroup_mma_wait(0, deps=(o,))
        mbarrier.arrive(p_empty, count=1)
        mbarrier.arrive(kv_empty.index(stage), count=1)
    mbarrier.wait(p_ready, num_tiles & 1)
    scale = alpha_smem.load(row_layout)
    rows = gl.program_id(0) * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_layout)
    _store_half(o, scale, rows, batch, slot, num_heads, num_rows,
                out_ptr, stride_ob, stride_os, stride_oh, partial_out_ptr, o_layout,
                V_BOXES_PER_WG)
