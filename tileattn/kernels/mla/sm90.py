"""MLA decode partial kernel for Hopper (sm90) in Gluon: TMA, mbarrier rings, wgmma, and
warp specialization, for blocks of 64 rows (H·q_len >= MIN_ROWS = 32; fewer than 64 run
padded) and a 16-bit cache (sm90_fp8.py reuses its consumers for an e4m3 cache).

It consumes the same split-KV plan (tileattn.scheduler.make_mla_plan) as the Triton kernel
decode.mla_decode_partial_kernel and writes exactly what that kernel writes: the final out /
lse for a sequence with one work item, else the item's normalised fp32 output and LSE in its
partial_out / partial_lse slot, which combine.py merges. The causal rule among the q_len tokens
(token j sees the first seq_len - q_len + 1 + j keys) and the row order of an M block (row r is
token r // num_heads, head r % num_heads) are the Triton kernel's; the pointer layouts are in
mla_sm90_partial_kernel's docstring.

One program per (row block of 64, work item), grid (row_blocks, num_work). Three partitions:
  * loader (1 warp): TMA. Q is 9 boxes of [64 rows, 64 cols]; a KV tile of 64 tokens is 9
    boxes of [64 tokens, 64 cols] (128-byte swizzle, TMA boxes are at most 256 wide), read
    from the cache seen as 3-D [num_pages, page_size, 576] at (page, token % page_size,
    64 c), so page_size must be a multiple of 64 (a tile then lies in one page). NUM_STAGES
    KV buffers, each with one "ready" mbarrier per box (Q K^T starts on box 0 while the
    rest land) and one "empty" mbarrier. With two or more row blocks per work item, row
    block 0's loader also issues one bulk L2 prefetch (cp.async.bulk.prefetch.L2, 72 KB) of
    the tile PREFETCH_TILES ahead, so the TMA loads of every row block find it in L2 rather
    than each waiting on HBM (docs/design.md, "MLA decode": per-box barriers and the prefetch
    were measured there).
  * softmax warpgroup and P V warpgroup: sm90_consumers.py (S once, P shared through shared
    memory, each warpgroup half of the 512 output columns; tails zeroed there).
The state the three partitions share (Gluon aggregates) is in sm90_state.py.

Shared memory: Q 72 KB + NUM_STAGES x 72 KB + P 8 KB (+ alpha 256 B): 2 stages = 224.3 KB of
the 227 KB a block may take.

No `from __future__ import annotations` here: Gluon checks aggregate fields against their
annotations, which must be classes, not strings.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.language.core import _aggregate as aggregate

from ..runtime import KernelLaunch
from ..gluon_common import GL_DTYPES, Scalar, scalar, tma_ready
from .sm90_consumers import pv_partition, softmax_partition
from .sm90_state import (BLOCK_M, BOX, LOG2_E, NUM_BOXES, V_BOXES, Buffers, Output, Pages,
                         Scores, WorkItem)

BLOCK_N = gl.constexpr(64)            # KV tokens per tile
NUM_COLS = gl.constexpr(576)
NUM_STAGES = 2
PREFETCH_TILES = 1    # L2 prefetch distance in tiles (measured: docs/design.md, "MLA decode")
# Registers a thread per partition (setmaxnreg): the softmax warpgroup then gets 256, since
# 256 + 208 + 24 <= 3 x 168 (the SM's 64K over 3 warpgroups); with a 240-register P V
# warpgroup the softmax one got 240 and spilled.
LOADER_REGS = gl.constexpr(24)
PV_REGS = gl.constexpr(208)
# Fewer rows than BLOCK_M run padded (TMA zero-fills them, they are never stored): the wgmma
# work is that of 64 rows, which still pays at 32 rows and not at 16 (docs/design.md, "MLA
# decode"; dispatch.mla_kernel asks supports_plan).
MIN_ROWS = 32


# ---------------------------------------------------------------------------------------------
# Loader partition (the consumers are in sm90_consumers.py)
# ---------------------------------------------------------------------------------------------

@aggregate
class L2Prefetch:
    """The cache as the L2 prefetch addresses it: raw pointer, page stride and page count (for
    clamping), the prefetch distance in tiles (0: no prefetch), and the bulk prefetch's
    instruction for a tile of TILE_BYTES issued by a partition of WARPS warps (each warp's
    elected lane prefetches its 1/WARPS of the tile)."""
    kv_ptr: Scalar
    stride_kv_page: Scalar
    num_pages: Scalar
    PREFETCH_TILES: gl.constexpr
    ASM: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, kv_ptr, stride_kv_page, num_pages, PREFETCH_TILES, TILE_BYTES=73728,
                 WARPS=1):
        self.kv_ptr = scalar(kv_ptr)
        self.stride_kv_page = scalar(stride_kv_page)
        self.num_pages = scalar(num_pages)
        self.PREFETCH_TILES = gl.constexpr(PREFETCH_TILES)
        chunk = gl.constexpr(TILE_BYTES).value // gl.constexpr(WARPS).value
        warps = gl.constexpr(WARPS).value
        self.ASM = gl.constexpr(
            "{ .reg .pred p; .reg .u32 w; .reg .u64 a; elect.sync _|p, 0xffffffff; "
            f"mov.u32 w, %tid.x; shr.u32 w, w, 5; and.b32 w, w, {warps - 1}; "
            f"mul.wide.u32 a, w, {chunk}; add.s64 a, a, $1; "
            f"@p cp.async.bulk.prefetch.L2.global [a], {chunk}; mov.u32 $0, 0; }}")

    @gluon.jit
    def tile(self, page_row, token, PAGE_SIZE: gl.constexpr):
        """One bulk L2 prefetch of the tile at `token` (contiguous: whole rows of one page), in
        WARPS pieces, each issued by one elected lane of a warp. The TMA load of that tile,
        PREFETCH_TILES tiles later, then reads L2 instead of waiting on HBM. The page id is
        clamped into the cache: unlike TMA loads, which zero-fill outside the descriptor, a
        prefetch takes a raw address."""
        page = gl.minimum(gl.maximum(gl.load(page_row + token // PAGE_SIZE), 0), self.num_pages - 1)
        tile = (self.kv_ptr + page.to(gl.int64) * self.stride_kv_page
                + (token % PAGE_SIZE) * NUM_COLS)
        gl.inline_asm_elementwise(self.ASM, "=r,l", [tile], dtype=gl.int32, is_pure=False,
                                  pack=1)


@gluon.jit
def _loader_partition(work_ptr, smem, q_desc, kv_desc, pages, l2):
    """TMA of Q and of the item's KV tiles, one barrier per box; L2 prefetch ahead (1 warp)."""
    item = WorkItem.load(work_ptr)
    smem.load_q(q_desc, item.batch)
    row_block = gl.program_id(0)
    page_row = pages.row(item.batch)
    PAGE_SIZE: gl.constexpr = pages.PAGE_SIZE
    num_tiles = gl.cdiv(item.kv_end - item.kv_start, BLOCK_N)
    # Row blocks of one work item read the same tiles: block 0 alone pulls them into L2.
    prefetch = (l2.PREFETCH_TILES > 0) & (row_block == 0)
    if prefetch:
        for j in range(gl.minimum(l2.PREFETCH_TILES, num_tiles)):
            l2.tile(page_row, item.kv_start + j * BLOCK_N, PAGE_SIZE)
    for j in range(num_tiles):
        token = item.kv_start + j * BLOCK_N
        page = gl.load(page_row + token // PAGE_SIZE)
        if prefetch:
            if j + l2.PREFETCH_TILES < num_tiles:
                l2.tile(page_row, token + l2.PREFETCH_TILES * BLOCK_N, PAGE_SIZE)
        stage = j % smem.NUM_STAGES
        phase = (j // smem.NUM_STAGES) & 1
        # Barriers start in phase 0; waiting for parity 1 passes at once (first fill).
        mbarrier.wait(smem.kv_empty.index(stage), phase ^ 1)
        for c in gl.static_range(NUM_BOXES):
            # One barrier per box, so Q K^T starts on the first box while the rest land.
            ready = smem.ready(stage, c)
            mbarrier.expect(ready, kv_desc.block_type.nbytes)
            if c < V_BOXES:
                tma.async_copy_global_to_shared(kv_desc, [page, token % PAGE_SIZE, c * BOX],
                                                ready, smem.kv_smem.index(stage * V_BOXES + c))
            else:
                tma.async_copy_global_to_shared(kv_desc, [page, token % PAGE_SIZE, c * BOX],
                                                ready, smem.rope_smem.index(stage))


@gluon.jit
def mla_sm90_partial_kernel(
    work_ptr, seq_lens_ptr, page_table_ptr, q_desc, kv_desc,
    out_ptr, lse_ptr, partial_out_ptr, partial_lse_ptr,
    stride_page_table_b, stride_ob, stride_os, stride_oh,
    num_heads, q_len, num_rows, softmax_scale_log2, kv_ptr, stride_kv_page, num_pages,
    PAGE_SIZE: gl.constexpr, NUM_STAGES: gl.constexpr, PREFETCH_TILES: gl.constexpr,
    PV_FIRST: gl.constexpr,
):
    """The partial results of one (row block, work item). Pointer layouts (element strides):
        q_desc      TMA descriptor of q [batch, q_len, num_heads, 576] (q_len and num_heads
                    adjacent, last dim contiguous) seen as [batch, num_rows, 576], boxes
                    [1, 64, 64]; row r of a block is token r // num_heads, head r % num_heads
        kv_desc     TMA descriptor of the cache [num_pages, PAGE_SIZE, 576], q's dtype, last
                    dim contiguous, boxes [1, 64 tokens, 64]; kv_ptr is its base, page stride
                    stride_kv_page (the L2 prefetch's raw addresses)
        page_table_ptr  int32 [batch, max_pages], row stride stride_page_table_b
        seq_lens_ptr    int32 [batch], contiguous
        work_ptr        int32 [num_work, 5], contiguous rows (batch, kv_start, kv_end, slot,
                        seq_len the plan was made for)
        out_ptr         [batch, q_len, num_heads, 512], q's dtype, strides stride_ob,
                        stride_os, stride_oh, last dim contiguous
        lse_ptr         float32 [batch, q_len, num_heads], contiguous, natural log
        partial_out_ptr float32 [num_slots, num_rows, 512], contiguous (num_rows = q_len ·
                        num_heads)
        partial_lse_ptr float32 [num_slots, num_rows], contiguous, natural log
    """
    smem = Buffers.allocate(q_desc, NUM_STAGES, BLOCK_N)
    output = Output(out_ptr, lse_ptr, partial_out_ptr, partial_lse_ptr, stride_ob, stride_os,
                    stride_oh, num_heads, num_rows)
    # A 16-bit cache: no descale (work_ptr stands in for its pointer), output scale 1.
    scores = Scores(seq_lens_ptr, q_len, softmax_scale_log2, 1.0, work_ptr, False, PV_FIRST)
    pages = Pages(page_table_ptr, stride_page_table_b, PAGE_SIZE)
    l2 = L2Prefetch(kv_ptr, stride_kv_page, num_pages, PREFETCH_TILES)
    gl.warp_specialize([
        (softmax_partition, (work_ptr, smem, output, scores)),
        (pv_partition, (work_ptr, smem, output)),
        (_loader_partition, (work_ptr, smem, q_desc, kv_desc, pages, l2)),
    ], [4, 1], [PV_REGS, LOADER_REGS])


# ---------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------

def supports_plan(num_rows: int, page_size: int, kv_dtype: torch.dtype) -> bool:
    """Whether plans of this shape can run here (mla_plan asks, through dispatch): H·q_len >=
    MIN_ROWS, page_size a multiple of 64 (a tile lies in one page), a 16-bit or e4m3 cache
    (sm90_fp8.py). Plan chunks are whole 64-key tiles by construction (the sm90 config's
    block_n)."""
    return (num_rows >= MIN_ROWS and page_size % BLOCK_N.value == 0
            and kv_dtype in (torch.float16, torch.bfloat16, torch.float8_e4m3fn))


def check_inputs(q: torch.Tensor, kv_cache: torch.Tensor) -> None:
    """What a call must also satisfy to run a plan made for this kernel: q's (token, head) dims
    mergeable into one row dim and TMA-addressable (16-byte aligned) q and kv_cache. Raises
    ValueError naming the tensor (make the plan with kernel="triton" for other layouts)."""
    batch, q_len, num_heads, _ = q.shape
    if q_len > 1 and q.stride(1) != num_heads * q.stride(2):
        raise ValueError(f"q must have its token and head dims adjacent (stride(1) == num_heads "
                         f"* stride(2)) for this plan's Gluon kernel, got strides {q.stride()}; "
                         f"make the plan with kernel='triton'")
    for name, x, dims in (("q", q, (0, 2)), ("kv_cache", kv_cache, (0, 1))):
        if not tma_ready(x, dims):
            raise ValueError(f"{name} must be 16-byte aligned with 16-byte aligned strides for "
                             f"this plan's Gluon kernel (TMA), got strides {x.stride()}; make "
                             f"the plan with kernel='triton'")


def prefetch_tiles(num_rows: int, kv_cache: torch.Tensor) -> int:
    """L2 prefetch distance for this launch: PREFETCH_TILES where a work item has two or more
    row blocks (only block 0 prefetches; the others then find the tile in L2), 0 for a single
    row block, where it measured slower (docs/design.md, "MLA decode"), and 0 where a page's
    rows are not contiguous (the bulk prefetch reads whole rows)."""
    contiguous = kv_cache.stride(1) == kv_cache.shape[2]
    return PREFETCH_TILES if num_rows > BLOCK_M.value and contiguous else 0


def kv_descriptor(kv_cache: torch.Tensor, tile_n: int, smem_dtype) -> TensorDescriptor:
    """TMA view of the cache as [num_pages, page_size, 576], boxes of [tile_n keys, 64 cols]
    laid out as smem_dtype's NVMMA layout."""
    layout = gl.NVMMASharedLayout.get_default_for([1, tile_n, BOX.value], smem_dtype)
    return TensorDescriptor(kv_cache, list(kv_cache.shape),
                            [kv_cache.stride(0), kv_cache.stride(1), 1], [1, tile_n, BOX.value],
                            layout)


def common_args(q, page_table, seq_lens, out, lse, plan, softmax_scale: float) -> dict:
    """The arguments both Gluon MLA kernels take (sm90_fp8.py adds its own)."""
    batch, q_len, num_heads, _ = q.shape
    num_rows = q_len * num_heads
    q_layout = gl.NVMMASharedLayout.get_default_for([1, BLOCK_M.value, BOX.value],
                                                    GL_DTYPES[q.dtype])
    # q as [batch, rows, 576]: TMA zero-fills rows past H·q_len.
    q_desc = TensorDescriptor(q, [batch, num_rows, q.shape[3]], [q.stride(0), q.stride(2), 1],
                              [1, BLOCK_M.value, BOX.value], q_layout)
    return dict(
        work_ptr=plan.work, seq_lens_ptr=seq_lens, page_table_ptr=page_table, q_desc=q_desc,
        out_ptr=out, lse_ptr=lse, partial_out_ptr=plan.partial_out,
        partial_lse_ptr=plan.partial_lse, stride_page_table_b=page_table.stride(0),
        stride_ob=out.stride(0), stride_os=out.stride(1), stride_oh=out.stride(2),
        num_heads=num_heads, q_len=q_len, num_rows=num_rows,
        softmax_scale_log2=softmax_scale * LOG2_E)


def mla_sm90_launch(q, kv_cache, page_table, seq_lens, out, lse, plan,
                    softmax_scale: float, kv_descale=None) -> KernelLaunch:
    """The partial-kernel launch for a 16-bit cache and a plan made for this kernel; same plan,
    same outputs as decode.mla_decode_partial_kernel (the combine launch is unchanged). An e4m3
    cache runs sm90_fp8.py's kernel instead (decode.mla_decode_launches picks)."""
    args = common_args(q, page_table, seq_lens, out, lse, plan, softmax_scale)
    args.update(kv_desc=kv_descriptor(kv_cache, BLOCK_N.value, GL_DTYPES[q.dtype]), kv_ptr=kv_cache,
                stride_kv_page=kv_cache.stride(0), num_pages=kv_cache.shape[0])
    num_rows = args["num_rows"]
    prefetch = prefetch_tiles(num_rows, kv_cache)
    # One row block an item is bound by its loads: the consumers release each tile as soon as
    # their P V retires (Scores.PV_FIRST); two or more are bound by the tensor cores, where
    # the softmax's overlap with P V is worth more (docs/design.md, "MLA decode").
    constexprs = dict(PAGE_SIZE=kv_cache.shape[1], NUM_STAGES=NUM_STAGES, PREFETCH_TILES=prefetch,
                      PV_FIRST=num_rows <= BLOCK_M.value)
    grid = (-(-num_rows // BLOCK_M.value), plan.num_work)
    # KernelLaunch's fast path keys the TMA descriptors by dtype, block shape and layout.
    return KernelLaunch(mla_sm90_partial_kernel, grid, args, constexprs, 4, 1)
