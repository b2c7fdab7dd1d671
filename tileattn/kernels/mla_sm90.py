"""MLA decode partial kernel for Hopper (sm90) in Gluon: TMA, mbarrier rings, wgmma, and
warp specialization, for blocks of 64 rows (H·q_len >= MIN_ROWS = 32; fewer than 64 run
padded) and a 16-bit cache (mla_sm90_fp8.py reuses its consumers for an e4m3 cache).

It consumes the same split-KV plan (tileattn.scheduler.make_mla_plan) as the Triton kernel
mla_decode.mla_decode_partial_kernel and writes exactly what that kernel writes: the final
out / lse for a sequence with one work item, else the item's normalised fp32 output and LSE in
its partial_out / partial_lse slot, which mla_decode_combine_kernel merges. Pointer layouts,
the causal rule among the q_len tokens (token j sees the first seq_len - q_len + 1 + j keys)
and the row order of an M block (row r is token r // num_heads, head r % num_heads) are the
Triton kernel's; see the docstring of tileattn/kernels/mla_decode.py.

One program per (row block of 64, work item), grid (row_blocks, num_work). Three partitions:
  * loader (1 warp): TMA. Q is 9 boxes of [64 rows, 64 cols]; a KV tile of 64 tokens is 9
    boxes of [64 tokens, 64 cols] (128-byte swizzle, TMA boxes are at most 256 wide), read
    from the cache seen as 3-D [num_pages, page_size, 576] at (page, token % page_size,
    64 c), so page_size must be a multiple of 64 (a tile then lies in one page). NUM_STAGES
    KV buffers, each with one "ready" mbarrier per box (Q K^T starts on box 0 while the
    rest land) and one "empty" mbarrier. With two or more row blocks per work item, row
    block 0's loader also issues one bulk L2 prefetch (cp.async.bulk.prefetch.L2, 72 KB) of
    the tile PREFETCH_TILES ahead, so the TMA loads of every row block find it in L2.
    Evidence (ncu, H128 batch 768 seq 2048, results/2026-11-23-h100-session6/): the softmax
    warpgroup spent ~40% of its cycles waiting on a tile's ready barrier, L2 hit rate 34%;
    per-box barriers took H128 from 406 to 441 TFLOP/s, the prefetch to 470.
  * softmax warpgroup (the default partition, 4 warps, 256 registers): S_j = Q K_j^T over
    the 9 boxes (one copy of S: no duplicated QK^T), online softmax, and its half of the
    output, O[:, :256] ([64, 256] fp32, 128 registers a thread) += P_j V_j[:, :256] with P in
    registers, one wgmma of N = 256 (see _v_half). Software pipelined one tile deep: S_{j+1} is issued together with
    O += P_j V_j, and the softmax of tile j+1 runs while the tensor cores do that P V.
    After each softmax it hands P_j (bf16/fp16, [64, 64]) and the row rescale factor alpha_j
    to the other warpgroup through shared memory (one buffer, p_ready / p_empty mbarriers).
  * P V warpgroup (4 warps): O[:, 256:] = O * alpha_j + P_j V_j[:, 256:] with P read from
    shared memory by wgmma. A last message after the final tile carries 1 / l instead of alpha.
V is the first 512 columns of the K tile (boxes 0-7, in their own ring; box 8, rope, in a
second ring), used as an MN-major B operand.
Sending P_j before waiting for this warpgroup's own P V (so the other can start sooner) was
tried and spills a register (the shared-memory base) at 256 registers; not kept.

Shared memory: Q 72 KB + NUM_STAGES x 72 KB + P 8 KB (+ alpha 256 B): 2 stages = 224.3 KB of
the 227 KB a block may take.

Tails: TMA reads whole 64-token tiles; the keys of a sequence's last tile past kv_end are in
the same page (allocated, but their contents are arbitrary, possibly NaN), so the softmax
warpgroup zeroes those rows in shared memory before the tile is used (0 * NaN would poison
P V). Rows of a block past H·q_len read zeros (TMA bounds of the [batch, rows, 576] q view)
and are never stored.
"""

from __future__ import annotations

import os

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .cross_compile import KernelLaunch
from .gluon_common import GL_DTYPES, online_softmax, tma_ready

BLOCK_M = gl.constexpr(64)            # rows per program: one wgmma M per warpgroup
BLOCK_N = gl.constexpr(64)            # KV tokens per tile
BOX = gl.constexpr(64)                # TMA box width (columns); 576 = 9 boxes, V = boxes 0-7
NUM_BOXES = gl.constexpr(9)
NUM_COLS = gl.constexpr(576)
V_BOXES = gl.constexpr(8)
V_BOXES_PER_WG = gl.constexpr(4)      # each consumer warpgroup owns 256 of V's 512 columns
NUM_STAGES = 2
PREFETCH_TILES = 1    # L2 prefetch distance in tiles (1 beat 2 at H128: mla-sm90-ab-boxes.json)
LOADER_REGS = 24
PV_REGS = 208     # P V warpgroup; the softmax warpgroup then gets 256 (256 + 208 + 24 <= 3 x 168)
                  # (at 240 the softmax warpgroup got 240 and spilled 72 bytes)
LOG2_E = 1.4426950408889634
# Fewer rows than BLOCK_M run padded (TMA zero-fills them, they are never stored): the wgmma
# work is that of 64 rows, which still beat the Triton kernel at 32 rows on big batches
# (mla_decode_policy.gluon_preferred); at 16 rows it only tied.
MIN_ROWS = 32


# ---------------------------------------------------------------------------------------------
# Partitions
# ---------------------------------------------------------------------------------------------

@gluon.jit
def _work_item(work_ptr):
    work_id = gl.program_id(1)
    batch = gl.load(work_ptr + work_id * 4)
    kv_start = gl.load(work_ptr + work_id * 4 + 1)
    kv_end = gl.load(work_ptr + work_id * 4 + 2)
    slot = gl.load(work_ptr + work_id * 4 + 3)
    return batch, kv_start, kv_end, slot


@gluon.jit
def _prefetch_tile_to_l2(kv_ptr, stride_kv_page, page_row, token, PAGE_SIZE: gl.constexpr):
    """One bulk L2 prefetch of the 64 x 576 tile at `token` (contiguous: whole rows of one
    page), issued by one elected lane. The TMA load of that tile, NUM_STAGES tiles later, then
    reads L2 instead of waiting on HBM."""
    page = gl.load(page_row + token // PAGE_SIZE)
    tile = kv_ptr + page.to(gl.int64) * stride_kv_page + (token % PAGE_SIZE) * NUM_COLS
    gl.inline_asm_elementwise(
        "{ .reg .pred p; elect.sync _|p, 0xffffffff; "
        "@p cp.async.bulk.prefetch.L2.global [$1], 73728; mov.u32 $0, 0; }",
        "=r,l", [tile], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _loader_partition(work_ptr, page_table_ptr, stride_page_table_b, q_desc, kv_desc,
                      q_smem, kv_smem, rope_smem, q_ready, kv_ready, kv_empty,
                      kv_ptr, stride_kv_page,
                      PAGE_SIZE: gl.constexpr, NUM_STAGES: gl.constexpr,
                      PREFETCH_TILES: gl.constexpr):
    batch, kv_start, kv_end, slot = _work_item(work_ptr)
    row_block = gl.program_id(0)
    mbarrier.expect(q_ready, NUM_BOXES * q_desc.block_type.nbytes)
    for c in gl.static_range(NUM_BOXES):
        tma.async_copy_global_to_shared(q_desc, [batch, row_block * BLOCK_M, c * BOX], q_ready,
                                        q_smem.index(c))
    page_row = page_table_ptr + batch.to(gl.int64) * stride_page_table_b
    num_tiles = gl.cdiv(kv_end - kv_start, BLOCK_N)
    # Row blocks of one work item read the same tiles: block 0 alone pulls them into L2.
    prefetch = (PREFETCH_TILES > 0) & (row_block == 0)
    if prefetch:
        for j in range(gl.minimum(PREFETCH_TILES, num_tiles)):
            _prefetch_tile_to_l2(kv_ptr, stride_kv_page, page_row, kv_start + j * BLOCK_N,
                                 PAGE_SIZE)
    for j in range(num_tiles):
        token = kv_start + j * BLOCK_N
        page = gl.load(page_row + token // PAGE_SIZE)
        if prefetch:
            if j + PREFETCH_TILES < num_tiles:
                _prefetch_tile_to_l2(kv_ptr, stride_kv_page, page_row,
                                     token + PREFETCH_TILES * BLOCK_N, PAGE_SIZE)
        stage = j % NUM_STAGES
        phase = (j // NUM_STAGES) & 1
        # Barriers start in phase 0; waiting for parity 1 passes at once (first fill).
        mbarrier.wait(kv_empty.index(stage), phase ^ 1)
        for c in gl.static_range(NUM_BOXES):
            # One barrier per box, so Q K^T starts on the first box while the rest land.
            ready = kv_ready.index(stage * NUM_BOXES + c)
            mbarrier.expect(ready, kv_desc.block_type.nbytes)
            if c < V_BOXES:
                tma.async_copy_global_to_shared(kv_desc, [page, token % PAGE_SIZE, c * BOX],
                                                ready, kv_smem.index(stage * V_BOXES + c))
            else:
                tma.async_copy_global_to_shared(kv_desc, [page, token % PAGE_SIZE, c * BOX],
                                                ready, rope_smem.index(stage))


@gluon.jit
def _box(smem, i):
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
    s = warpgroup_mma(_box(q_smem, 0), _box(kv_smem, stage * V_BOXES).permute((1, 0)), s_zero,
                      use_acc=False, is_async=True)
    for c in gl.static_range(1, V_BOXES):
        mbarrier.wait(kv_ready.index(stage * NUM_BOXES + c), phase)
        s = warpgroup_mma(_box(q_smem, c), _box(kv_smem, stage * V_BOXES + c).permute((1, 0)), s,
                          is_async=True)
    mbarrier.wait(kv_ready.index(stage * NUM_BOXES + V_BOXES), phase)
    s = warpgroup_mma(_box(q_smem, V_BOXES), _box(rope_smem, stage).permute((1, 0)), s,
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
            buf = _box(kv_smem, stage * V_BOXES + c)
        else:
            buf = _box(rope_smem, stage)
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
def _softmax_partition(work_ptr, seq_lens_ptr, out_ptr, lse_ptr, partial_out_ptr, partial_lse_ptr,
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

    batch, kv_start, kv_end, slot = _work_item(work_ptr)
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
    if slot < 0:
        gl.store(lse_ptr + batch.to(gl.int64) * num_rows + rows, lse, mask=rows < num_rows)
    else:
        gl.store(partial_lse_ptr + slot.to(gl.int64) * num_rows + rows, lse, mask=rows < num_rows)


@gluon.jit
def _pv_partition(work_ptr, out_ptr, partial_out_ptr, stride_ob, stride_os, stride_oh,
                  num_heads, num_rows, kv_smem, p_smem, alpha_smem,
                  kv_ready, kv_empty, p_ready, p_empty, NUM_STAGES: gl.constexpr):
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, V_BOXES_PER_WG * BOX, 16])
    row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    batch, kv_start, kv_end, slot = _work_item(work_ptr)
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


@gluon.jit
def mla_sm90_partial_kernel(
    work_ptr, seq_lens_ptr, page_table_ptr, q_desc, kv_desc,
    out_ptr, lse_ptr, partial_out_ptr, partial_lse_ptr,
    stride_page_table_b, stride_ob, stride_os, stride_oh,
    num_heads, q_len, num_rows, softmax_scale_log2, kv_ptr, stride_kv_page,
    PAGE_SIZE: gl.constexpr, NUM_STAGES: gl.constexpr,
    PV_REGS: gl.constexpr, LOADER_REGS: gl.constexpr, PREFETCH_TILES: gl.constexpr,
):
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [NUM_BOXES] + q_desc.block_type.shape, q_desc.layout)
    # A KV tile: boxes 0-7 (the 512 latent columns, also V) and box 8 (rope), apart because
    # shared buffers need power-of-two inner dims.
    kv_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES * V_BOXES] + kv_desc.block_type.shape,
                                        kv_desc.layout)
    rope_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + kv_desc.block_type.shape,
                                          kv_desc.layout)
    p_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], dtype))
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

    gl.warp_specialize([
        (_softmax_partition, (work_ptr, seq_lens_ptr, out_ptr, lse_ptr, partial_out_ptr,
                              partial_lse_ptr, stride_ob, stride_os, stride_oh, num_heads, q_len,
                              num_rows, softmax_scale_log2, 1.0, work_ptr, q_smem, kv_smem,
                              rope_smem, p_smem, alpha_smem, q_ready, kv_ready, kv_empty,
                              p_ready, p_empty, NUM_STAGES, False)),
        (_pv_partition, (work_ptr, out_ptr, partial_out_ptr, stride_ob, stride_os, stride_oh,
                         num_heads, num_rows, kv_smem, p_smem, alpha_smem,
                         kv_ready, kv_empty, p_ready, p_empty, NUM_STAGES)),
        (_loader_partition, (work_ptr, page_table_ptr, stride_page_table_b, q_desc, kv_desc,
                             q_smem, kv_smem, rope_smem, q_ready, kv_ready, kv_empty,
                             kv_ptr, stride_kv_page, PAGE_SIZE, NUM_STAGES, PREFETCH_TILES)),
    ], [4, 1], [PV_REGS, LOADER_REGS])


# ---------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------

def supports(q: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """Whether mla_sm90_launch handles these (already validated) inputs: a cache in q's 16-bit
    dtype or e4m3 (mla_sm90_fp8.py), H·q_len >= MIN_ROWS, page_size a multiple of 64, q's
    (token, head) dims mergeable into one row dim, TMA-aligned strides."""
    batch, q_len, num_heads, _ = q.shape
    if q.dtype not in (torch.float16, torch.bfloat16):
        return False
    if kv_cache.dtype not in (q.dtype, torch.float8_e4m3fn):
        return False
    if q_len * num_heads < MIN_ROWS or kv_cache.shape[1] % BLOCK_N.value != 0:
        return False
    if q_len > 1 and q.stride(1) != num_heads * q.stride(2):
        return False
    return tma_ready(q, (0, 2)) and tma_ready(kv_cache, (0, 1))


def prefetch_tiles(num_rows: int, kv_cache: torch.Tensor) -> int:
    """L2 prefetch distance for this launch: PREFETCH_TILES where a work item has two or more
    row blocks (only block 0 prefetches; the others then find the tile in L2), 0 for a single
    row block, where it measured slower (H100, results/2026-11-23-h100-session6/mla-sm90-ab-
    boxes.json: H64 0.89 -> 0.75 of the copy rate at batch 768, seq 2048), and 0 where a page's
    rows are not contiguous (the bulk prefetch reads whole rows).
    TILEATTN_MLA_PREFETCH=n overrides it (tuning runs, benchmarks/mla_sm90_ab.py)."""
    contiguous = kv_cache.stride(1) == kv_cache.shape[2]
    default = PREFETCH_TILES if num_rows > BLOCK_M.value and contiguous else 0
    return int(os.environ.get("TILEATTN_MLA_PREFETCH", default)) if contiguous else 0


def mla_sm90_launch(q, kv_cache, page_table, seq_lens, out, lse, plan,
                    softmax_scale: float, kv_descale=None) -> KernelLaunch:
    """The partial-kernel launch for inputs that supports() accepted; same plan, same outputs
    as mla_decode.mla_decode_partial_kernel (the combine launch is unchanged). An e4m3 cache
    runs mla_sm90_fp8.py's kernel."""
    if kv_cache.dtype == torch.float8_e4m3fn:
        from .mla_sm90_fp8 import mla_sm90_fp8_launch
        return mla_sm90_fp8_launch(q, kv_cache, page_table, seq_lens, kv_descale, out, lse, plan,
                                   softmax_scale)
    batch, q_len, num_heads, _ = q.shape
    num_rows = q_len * num_heads
    dtype = GL_DTYPES[q.dtype]
    layout = gl.NVMMASharedLayout.get_default_for([1, BLOCK_N.value, BOX.value], dtype)
    # q as [batch, rows, 576]: TMA zero-fills rows past H·q_len.
    q_desc = TensorDescriptor(q, [batch, num_rows, q.shape[3]], [q.stride(0), q.stride(2), 1],
                              [1, BLOCK_M.value, BOX.value], layout)
    kv_desc = TensorDescriptor(kv_cache, list(kv_cache.shape),
                               [kv_cache.stride(0), kv_cache.stride(1), 1], [1, BLOCK_N.value, BOX.value], layout)
    args = dict(
        work_ptr=plan.work, seq_lens_ptr=seq_lens, page_table_ptr=page_table,
        q_desc=q_desc, kv_desc=kv_desc, out_ptr=out, lse_ptr=lse,
        partial_out_ptr=plan.partial_out, partial_lse_ptr=plan.partial_lse,
        stride_page_table_b=page_table.stride(0),
        stride_ob=out.stride(0), stride_os=out.stride(1), stride_oh=out.stride(2),
        num_heads=num_heads, q_len=q_len, num_rows=num_rows,
        softmax_scale_log2=softmax_scale * LOG2_E, kv_ptr=kv_cache,
        stride_kv_page=kv_cache.stride(0),
    )
    prefetch = prefetch_tiles(num_rows, kv_cache)
    constexprs = dict(PAGE_SIZE=kv_cache.shape[1], NUM_STAGES=NUM_STAGES,
                      PV_REGS=PV_REGS, LOADER_REGS=LOADER_REGS, PREFETCH_TILES=prefetch)
    grid = (-(-num_rows // BLOCK_M.value), plan.num_work)
    # KernelLaunch's fast path keys the TMA descriptors by dtype, block shape and layout.
    return KernelLaunch(mla_sm90_partial_kernel, grid, args, constexprs, 4, 1)
