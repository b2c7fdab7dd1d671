"""MLA decode partial kernel for Hopper (sm90) in Gluon with an FP8 (e4m3) cache: the cache is
read from HBM as e4m3 (half the bytes of bf16) and widened to q's 16-bit type in shared
memory, in place, so both GEMMs run on the same 16-bit wgmma, on the same 64-key tiles and
the same shared memory as sm90.py, and q keeps its precision.

Same plan, inputs and outputs as sm90.py (the pointer layouts are in
mla_sm90_fp8_partial_kernel's docstring, the causal rule in sm90.py's); its softmax and P V
partitions are reused as they are. What differs is the producer:
  * widen partition (4 warps, replaces the 1-warp loader): once the consumers have released a
    stage, one TMA load of the tile's 36 KB of e4m3 (9 boxes of [64 tokens, 64 cols], one
    barrier) into the stage's own 72 KB: the 8 latent boxes into the upper half of the 16-bit
    V boxes (4-7), the rope box into the upper half of the 16-bit rope box. Then each e4m3 box
    is read into registers, converted and stored as its 16-bit box, in an order in which a
    store never lands on e4m3 bytes another thread has yet to read (the phases and barriers
    of `_widen_in_place`). Boxes 0-3, then 4-8, are released to the consumers by each
    thread's fence and arrive on their group's barrier (Buffers.ready, READY_SPLIT).
    Widening in place is what lets the tiles have 64 keys: a separate e4m3 ring would not fit
    beside Q (72 KB) and two 72 KB stages, and 32-key tiles halve every wgmma's N and double
    the per-tile costs of both consumers (docs/design.md, "MLA decode", "FP8 cache").
  * With two stages the load of tile j waits for the consumers to release tile j - 2, so
    they release it as soon as their P V retires (Scores.PV_FIRST), and an L2 prefetch
    PREFETCH_TILES tiles ahead (each warp a quarter of the tile) lets the load read L2.
  * The descale is not applied while widening: it multiplies the softmax scale and the output
    (the softmax partition's HAS_DESCALE), so widening is a plain type conversion.
Register split: softmax 256 + P V 192 + widen 56 = 504 (3 warpgroups x 168).

No `from __future__ import annotations` here: Gluon checks aggregate fields against their
annotations, which must be classes, not strings.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.language.core import _aggregate as aggregate

from ..runtime import KernelLaunch
from ..gluon_common import GL_DTYPES, release
from .sm90 import BLOCK_N, NUM_COLS, L2Prefetch, kv_descriptor, common_args
from .sm90_consumers import pv_partition, softmax_partition
from .sm90_state import (BLOCK_M, BOX, NUM_BOXES, V_BOXES, Buffers, Output, Pages, Scores,
                         WorkItem, box_view)

TILE_N = BLOCK_N              # 64 KV tokens per tile, as the 16-bit kernel
NUM_STAGES = 2                # 16-bit tiles (the e4m3 bytes land inside them)
PREFETCH_TILES = 1            # L2 prefetch distance in tiles
WIDEN_WARPS = gl.constexpr(4)
READY_SPLIT = gl.constexpr(4)  # boxes 0-3 are released first, 4-8 after (_widen_in_place)
# softmax 256 + P V 192 + widen 56 = 504 (3 warpgroups x 168); at 200 / 48 the widen warps
# spilled 8 bytes with fp16 q.
PV_REGS = gl.constexpr(192)
WIDEN_REGS = gl.constexpr(56)


# e4m3 -> bf16 without a conversion instruction: sign to bit 15, the 7 exponent-and-mantissa
# bits to bits 10-4. The bf16 exponent field then equals e4m3's, so every value (subnormals and
# zero included) comes out exactly 2^-120 times the e4m3 value; BF16_WIDEN_SCALE = 2^120 goes
# into the softmax and output scales. A byte permute puts each e4m3 byte b in a 16-bit lane
# above a copy of its sign (PRMT's sign-replicating selectors 8-B): (sign byte << 8 | b) << 4,
# masked, keeps the sign at bit 15 and b's low 7 bits at 4-10. Three integer ops per two
# values, where Triton's conversion goes through fp16 and one F2F.BF16.F16 per value on the
# slow conversion pipe (SASS), and the widening is on the tile's critical path (docs/design.md,
# "MLA decode", "FP8 cache"). e4m3 NaN (0x7f) comes out finite; past-the-end rows are zeroed
# by the softmax warpgroup anyway.
_E4M3_TO_BF16_ASM = gl.constexpr("""{
    .reg .b32 lo, hi;
    prmt.b32 lo, $2, 0, 0x9180;
    prmt.b32 hi, $2, 0, 0xB3A2;
    shl.b32 lo, lo, 4;  and.b32 $0, lo, 0x87F087F0;
    shl.b32 hi, hi, 4;  and.b32 $1, hi, 0x87F087F0;
}""")
BF16_WIDEN_SCALE = 2.0 ** 120


@gluon.jit
def _widen(x, dtype: gl.constexpr):
    """e4m3 -> q's dtype: bf16 scaled by 2^-120 (above), fp16 exactly (one cvt per two)."""
    if dtype == gl.bfloat16:
        return gl.inline_asm_elementwise(_E4M3_TO_BF16_ASM, "=r,=r,r", [x], dtype=gl.bfloat16,
                                         is_pure=True, pack=4)
    else:
        return x.to(dtype)


@aggregate
class RawTiles:
    """The e4m3 view of the 16-bit ring: `kv` sees each 16-bit [64, 64] box as two e4m3 boxes
    (box b's halves are 2b and 2b + 1), `rope` the same for the rope ring; two "landed"
    barriers per stage, for the TMA of e4m3 boxes 0-3 and 4-8 (the widening starts on the
    first group while the second is in flight). E4m3 box c < 8 of stage s sits in
    kv box 16 s + 8 + c (the upper half of the stage's V boxes 4-7), box 8 in rope box
    2 s + 1 (the upper half of the stage's rope box)."""
    desc: tma.tensor_descriptor
    kv: gl.shared_memory_descriptor
    rope: gl.shared_memory_descriptor
    landed: gl.shared_memory_descriptor

    @gluon.constexpr_function
    def __init__(self, desc, kv, rope, landed):
        self.desc = desc
        self.kv = kv
        self.rope = rope
        self.landed = landed

    @gluon.jit
    def allocate(desc, smem):
        """Views over `smem`'s 16-bit ring in the TMA descriptor's e4m3 layout, and barriers."""
        kv = smem.kv_smem._reinterpret(desc.dtype, [2 * smem.kv_smem.shape[0]] +
                                       desc.block_type.shape, desc.layout)
        rope = smem.rope_smem._reinterpret(desc.dtype, [2 * smem.rope_smem.shape[0]] +
                                           desc.block_type.shape, desc.layout)
        landed = gl.allocate_shared_memory(gl.int64, [2 * smem.NUM_STAGES, 1],
                                           mbarrier.MBarrierLayout())
        for i in gl.static_range(2 * smem.NUM_STAGES):
            mbarrier.init(landed.index(i), count=1)
        return RawTiles(desc, kv, rope, landed)

    @gluon.jit
    def box(self, stage, c: gl.constexpr):
        """E4m3 box c of the tile in `stage`, as a [64, 64] tile."""
        if c < V_BOXES:
            return box_view(self.kv, (2 * V_BOXES) * stage + V_BOXES + c)
        else:
            return box_view(self.rope, 2 * stage + 1)

    @gluon.jit
    def load(self, page_row, token, stage, PAGE_SIZE: gl.constexpr):
        """TMA of the e4m3 tile at `token` into `stage`: boxes below READY_SPLIT on the
        stage's first "landed" barrier, the others on its second."""
        page = gl.load(page_row + token // PAGE_SIZE)
        first = self.landed.index(2 * stage)
        second = self.landed.index(2 * stage + 1)
        mbarrier.expect(first, READY_SPLIT * self.desc.block_type.nbytes)
        mbarrier.expect(second, (NUM_BOXES - READY_SPLIT) * self.desc.block_type.nbytes)
        for c in gl.static_range(NUM_BOXES):
            tma.async_copy_global_to_shared(self.desc, [page, token % PAGE_SIZE, c * BOX],
                                            first if c < READY_SPLIT else second,
                                            self.box(stage, c))

    @gluon.jit
    def wait(self, stage, group: gl.constexpr, phase):
        """Until e4m3 boxes 0-3 (group 0) or 4-8 (group 1) of the tile in `stage` have landed."""
        mbarrier.wait(self.landed.index(2 * stage + group), phase)


@gluon.jit
def _store_widened(smem, stage, c: gl.constexpr, x):
    """The 16-bit box c of the tile in `stage` from its e4m3 values x."""
    if c < V_BOXES:
        box_view(smem.kv_smem, stage * V_BOXES + c).store(_widen(x, smem.kv_smem.dtype))
    else:
        box_view(smem.rope_smem, stage).store(_widen(x, smem.kv_smem.dtype))


@gluon.jit
def _release_boxes(smem, stage, FIRST: gl.constexpr):
    """Make this thread's stores visible to the wgmmas, then arrive on the barrier of the group
    of boxes from FIRST (Buffers.ready; it counts every widening thread, so no warpgroup
    barrier comes before the arrive)."""
    fence_async_shared()
    release(smem.ready(stage, FIRST), True)


@gluon.jit
def _widen_in_place(smem, raw, stage, phase):
    """Widen the e4m3 tile in `stage` into its 16-bit boxes. E4m3 boxes 0-7 sit two to a 16-bit
    box in boxes 4-7, box 8 in the rope box's upper half (RawTiles). The order keeps every
    store off e4m3 bytes that some thread has not yet read:
      1. e4m3 0-3 (in 16-bit 4-5) -> 16-bit 0-3, which hold no e4m3; boxes 0-3 released;
      2. once e4m3 4-8 have landed, e4m3 4-5 (in 16-bit 6) read, a barrier (all of e4m3 0-3
         read), 16-bit 4-5 stored;
      3. e4m3 6-7 (in 16-bit 7) read, a barrier (e4m3 4-5 read too), 16-bit 6-7 stored;
      4. e4m3 8 (in the rope box's upper half) read, a barrier, the rope box stored; a fence
         releases boxes 4-8.
    Loads go two or three boxes ahead of their stores (shared-memory accesses stay in order, so
    a load issued after a store waits for it)."""
    # 16 e4m3 (16 bytes) per thread per load: a [64, 64] box in two passes of 128 threads.
    box_layout: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [WIDEN_WARPS, 1], [1, 0])
    x0 = raw.box(stage, 0).load(box_layout)
    x1 = raw.box(stage, 1).load(box_layout)
    _store_widened(smem, stage, 0, x0)
    _store_widened(smem, stage, 1, x1)
    x2 = raw.box(stage, 2).load(box_layout)
    x3 = raw.box(stage, 3).load(box_layout)
    _store_widened(smem, stage, 2, x2)
    _store_widened(smem, stage, 3, x3)
    _release_boxes(smem, stage, 0)
    raw.wait(stage, 1, phase)
    x4 = raw.box(stage, 4).load(box_layout)
    x5 = raw.box(stage, 5).load(box_layout)
    gl.thread_barrier()
    _store_widened(smem, stage, 4, x4)
    _store_widened(smem, stage, 5, x5)
    x6 = raw.box(stage, 6).load(box_layout)
    x7 = raw.box(stage, 7).load(box_layout)
    gl.thread_barrier()
    _store_widened(smem, stage, 6, x6)
    _store_widened(smem, stage, 7, x7)
    x8 = raw.box(stage, 8).load(box_layout)
    gl.thread_barrier()
    _store_widened(smem, stage, 8, x8)
    _release_boxes(smem, stage, READY_SPLIT)


@gluon.jit
def _widen_partition(work_ptr, smem, q_desc, raw, pages, l2):
    """Q's TMA; per tile: wait for the consumers to release its stage, TMA of its e4m3 bytes
    into it, widening in place; L2 prefetch ahead (4 warps)."""
    item = WorkItem.load(work_ptr)
    smem.load_q(q_desc, item.batch)
    page_row = pages.row(item.batch)
    PAGE_SIZE: gl.constexpr = pages.PAGE_SIZE
    num_tiles = gl.cdiv(item.kv_end - item.kv_start, TILE_N)
    # Row blocks of one work item read the same tiles: block 0 alone pulls them into L2.
    prefetch = (l2.PREFETCH_TILES > 0) & (gl.program_id(0) == 0)
    if prefetch:
        for j in range(gl.minimum(l2.PREFETCH_TILES, num_tiles)):
            l2.tile(page_row, item.kv_start + j * TILE_N, PAGE_SIZE)
    for j in range(num_tiles):
        stage = j % smem.NUM_STAGES
        phase = (j // smem.NUM_STAGES) & 1
        token = item.kv_start + j * TILE_N
        if prefetch:
            if j + l2.PREFETCH_TILES < num_tiles:
                l2.tile(page_row, token + l2.PREFETCH_TILES * TILE_N, PAGE_SIZE)
        # Barriers start in phase 0; waiting for parity 1 passes at once (first fill).
        mbarrier.wait(smem.kv_empty.index(stage), phase ^ 1)
        raw.load(page_row, token, stage, PAGE_SIZE)
        raw.wait(stage, 0, phase)
        _widen_in_place(smem, raw, stage, phase)


@gluon.jit
def mla_sm90_fp8_partial_kernel(
    work_ptr, seq_lens_ptr, page_table_ptr, q_desc, raw_desc,
    out_ptr, lse_ptr, partial_out_ptr, partial_lse_ptr, kv_descale_ptr,
    stride_page_table_b, stride_ob, stride_os, stride_oh,
    num_heads, q_len, num_rows, softmax_scale_log2, output_scale, kv_ptr, stride_kv_page,
    num_pages,
    PAGE_SIZE: gl.constexpr, NUM_STAGES: gl.constexpr, HAS_DESCALE: gl.constexpr,
    PREFETCH_TILES: gl.constexpr,
):
    """The partial results of one (row block, work item) from an e4m3 cache. Pointer layouts
    (element strides) as mla_sm90_partial_kernel's, except:
        raw_desc        TMA descriptor of the e4m3 cache [num_pages, PAGE_SIZE, 576], last dim
                        contiguous, boxes [1, 64 tokens, 64]; kv_ptr is its base, page stride
                        stride_kv_page (the L2 prefetch's raw addresses)
        kv_descale_ptr  float32 scalar, read only with HAS_DESCALE (else any valid pointer)
    output_scale multiplies the output and the factor it undoes is in softmax_scale_log2 (the
    bf16 widening's 2^-120)."""
    smem = Buffers.allocate(q_desc, NUM_STAGES, TILE_N, WIDEN_WARPS * 32, READY_SPLIT)
    raw = RawTiles.allocate(raw_desc, smem)
    output = Output(out_ptr, lse_ptr, partial_out_ptr, partial_lse_ptr, stride_ob, stride_os,
                    stride_oh, num_heads, num_rows)
    # The consumers release each tile as soon as their P V retires: the next widening waits
    # for that release (Scores.PV_FIRST).
    scores = Scores(seq_lens_ptr, q_len, softmax_scale_log2, output_scale, kv_descale_ptr,
                    HAS_DESCALE, True)
    pages = Pages(page_table_ptr, stride_page_table_b, PAGE_SIZE)
    l2 = L2Prefetch(kv_ptr, stride_kv_page, num_pages, PREFETCH_TILES, TILE_N * NUM_COLS,
                    WIDEN_WARPS)
    gl.warp_specialize([
        (softmax_partition, (work_ptr, smem, output, scores)),
        (pv_partition, (work_ptr, smem, output)),
        (_widen_partition, (work_ptr, smem, q_desc, raw, pages, l2)),
    ], [4, WIDEN_WARPS], [PV_REGS, WIDEN_REGS])


def mla_sm90_fp8_launch(q, kv_cache, page_table, seq_lens, kv_descale, out, lse, plan,
                        softmax_scale: float) -> KernelLaunch:
    """The partial-kernel launch for an e4m3 cache that sm90.supports_plan() accepted."""
    # bf16: the widened values are 2^-120 x the cache's (_E4M3_TO_BF16_ASM); the scales undo it.
    widen_scale = BF16_WIDEN_SCALE if q.dtype == torch.bfloat16 else 1.0
    args = common_args(q, page_table, seq_lens, out, lse, plan, softmax_scale * widen_scale)
    args.update(raw_desc=kv_descriptor(kv_cache, TILE_N.value, GL_DTYPES[kv_cache.dtype]),
                kv_descale_ptr=kv_descale if kv_descale is not None else seq_lens,
                output_scale=widen_scale, kv_ptr=kv_cache, stride_kv_page=kv_cache.stride(0),
                num_pages=kv_cache.shape[0])
    num_rows = args["num_rows"]
    # The bulk prefetch reads whole rows: only where a page's rows are contiguous.
    prefetch = PREFETCH_TILES if kv_cache.stride(1) == kv_cache.shape[2] else 0
    constexprs = dict(PAGE_SIZE=kv_cache.shape[1], NUM_STAGES=NUM_STAGES,
                      HAS_DESCALE=kv_descale is not None, PREFETCH_TILES=prefetch)
    grid = (-(-num_rows // BLOCK_M.value), plan.num_work)
    return KernelLaunch(mla_sm90_fp8_partial_kernel, grid, args, constexprs, 4, 1)
