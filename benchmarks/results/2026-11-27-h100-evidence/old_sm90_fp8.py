"""MLA decode partial kernel for Hopper (sm90) in Gluon with an FP8 (e4m3) cache: the cache is
read from HBM as e4m3 (half the bytes of bf16) and widened to q's 16-bit type in shared
memory, so both GEMMs run on the same 16-bit wgmma as sm90.py and q keeps its precision.

Same plan, inputs and outputs as sm90.py (the pointer layouts are in
mla_sm90_fp8_partial_kernel's docstring, the causal rule in sm90.py's); its softmax and P V
partitions are reused as they are. What differs:
  * widen partition (4 warps, replaces the 1-warp loader): TMA loads of the e4m3 tile (9 boxes
    of [32 tokens, 64 cols], one "raw" barrier per tile) into a RAW_STAGES ring; then each box
    is read into registers, converted to 16 bits and stored into the NUM_STAGES ring of 16-bit
    tiles that the consumers read, with one "ready" barrier per box, released after a fence:
    once for the tile with bf16 q, per three boxes with fp16 q. Once a raw tile is read, the
    same warps refill it with the tile RAW_STAGES ahead.
  * TILE_N = 32 tokens: a 16-bit tile is 36 KB, so Q (72 KB) + 3 widened tiles (108 KB) + 2
    raw tiles (36 KB) + P fit in 227 KB; 64-token tiles would leave no room for the raw ring.
  * The descale is not applied while widening: it multiplies the softmax scale and the output
    (the softmax partition's HAS_DESCALE), so widening is a plain type conversion.
Register split: softmax 256 + P V 200 + widen 48 = 504 (3 warpgroups x 168).

No `from __future__ import annotations` here: Gluon checks aggregate fields against their
annotations, which must be classes, not strings.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.language.core import _aggregate as aggregate

from ..runtime import KernelLaunch
from ..gluon_common import GL_DTYPES
from .sm90 import kv_descriptor, common_args
from .sm90_consumers import pv_partition, softmax_partition
from .sm90_state import (BLOCK_M, BOX, NUM_BOXES, V_BOXES, Buffers, Output, Pages, Scores,
                         WorkItem, box_view)

TILE_N = gl.constexpr(32)     # KV tokens per tile (see the module docstring)
NUM_STAGES = 3                # widened 16-bit tiles
RAW_STAGES = gl.constexpr(2)  # e4m3 tiles as loaded
# softmax 256 + P V 200 + widen 48 = 504 (3 warpgroups x 168); at 208 / 40 the widen
# warps spilled 8 bytes.
PV_REGS = gl.constexpr(200)
WIDEN_REGS = gl.constexpr(48)


# e4m3 -> bf16 without a conversion instruction: sign to bit 15, the 7 exponent-and-mantissa
# bits to bits 10-4. The bf16 exponent field then equals e4m3's, so every value (subnormals and
# zero included) comes out exactly 2^-120 times the e4m3 value; BF16_WIDEN_SCALE = 2^120 goes
# into the softmax and output scales. Five integer ops per two values, where Triton's
# conversion goes through fp16 and one F2F.BF16.F16 per value on the slow conversion pipe
# (SASS), and the widen warps are this kernel's bottleneck (docs/design.md, "MLA decode", "FP8
# cache"). e4m3 NaN (0x7f) comes out finite; past-the-end rows are zeroed by the softmax
# warpgroup anyway.
_E4M3_TO_BF16_ASM = gl.constexpr("""{
    .reg .b32 lo, hi, t;
    prmt.b32 lo, $2, 0, 0x4140;
    prmt.b32 hi, $2, 0, 0x4342;
    shl.b32 t, lo, 4;  and.b32 t, t, 0x07F007F0;  shl.b32 lo, lo, 8;  and.b32 lo, lo, 0x80008000;
    or.b32 $0, t, lo;
    shl.b32 t, hi, 4;  and.b32 t, t, 0x07F007F0;  shl.b32 hi, hi, 8;  and.b32 hi, hi, 0x80008000;
    or.b32 $1, t, hi;
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
class RawRing:
    """The e4m3 tiles as TMA loads them: RAW_STAGES tiles of 9 boxes of [TILE_N tokens, 64
    cols] (raw_desc's boxes), one "ready" barrier per tile."""
    desc: tma.tensor_descriptor
    smem: gl.shared_memory_descriptor
    ready: gl.shared_memory_descriptor

    @gluon.constexpr_function
    def __init__(self, desc, smem, ready):
        self.desc = desc
        self.smem = smem
        self.ready = ready

    @gluon.jit
    def allocate(desc):
        smem = gl.allocate_shared_memory(
            desc.dtype, [RAW_STAGES * NUM_BOXES] + desc.block_type.shape, desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [RAW_STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(RAW_STAGES):
            mbarrier.init(ready.index(i), count=1)
        return RawRing(desc, smem, ready)

    @gluon.jit
    def load(self, page_row, token, raw_stage, PAGE_SIZE: gl.constexpr):
        """TMA of the e4m3 tile at `token` (9 boxes, one barrier) into raw stage `raw_stage`."""
        page = gl.load(page_row + token // PAGE_SIZE)
        bar = self.ready.index(raw_stage)
        mbarrier.expect(bar, NUM_BOXES * self.desc.block_type.nbytes)
        for c in gl.static_range(NUM_BOXES):
            tma.async_copy_global_to_shared(self.desc, [page, token % PAGE_SIZE, c * BOX], bar,
                                            self.smem.index(raw_stage * NUM_BOXES + c))


@gluon.jit
def _widen_partition(work_ptr, smem, q_desc, raw, pages):
    """Q's TMA, the raw ring's TMA, and the widening of each raw tile into the 16-bit ring
    (4 warps)."""
    item = WorkItem.load(work_ptr)
    smem.load_q(q_desc, item.batch)
    page_row = pages.row(item.batch)
    PAGE_SIZE: gl.constexpr = pages.PAGE_SIZE
    kv_smem = smem.kv_smem
    num_tiles = gl.cdiv(item.kv_end - item.kv_start, TILE_N)
    for j in range(gl.minimum(RAW_STAGES, num_tiles)):
        raw.load(page_row, item.kv_start + j * TILE_N, j, PAGE_SIZE)
    # 16 e4m3 (16 bytes) per thread per load: a [32, 64] box in one pass of 128 threads.
    box_layout: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
    for j in range(num_tiles):
        raw_stage = j % RAW_STAGES
        stage = j % smem.NUM_STAGES
        mbarrier.wait(smem.kv_empty.index(stage), ((j // smem.NUM_STAGES) & 1) ^ 1)
        mbarrier.wait(raw.ready.index(raw_stage), (j // RAW_STAGES) & 1)
        # Boxes three at a time, all three loaded before any is stored (the loads would
        # otherwise wait behind the stores: smem accesses stay in order). bf16: one fence +
        # barrier round trip for the tile, the round trips being on this partition's critical
        # path; fp16 keeps one per three boxes, as one per tile spills 16 bytes there
        # (docs/design.md, "FP8 cache").
        GROUPS_PER_FENCE: gl.constexpr = 3 if kv_smem.dtype == gl.bfloat16 else 1
        for g in gl.static_range(NUM_BOXES // 3):
            first = raw_stage * NUM_BOXES + 3 * g
            x0 = box_view(raw.smem, first).load(box_layout)
            x1 = box_view(raw.smem, first + 1).load(box_layout)
            x2 = box_view(raw.smem, first + 2).load(box_layout)
            box_view(kv_smem, stage * V_BOXES + 3 * g).store(_widen(x0, kv_smem.dtype))
            box_view(kv_smem, stage * V_BOXES + 3 * g + 1).store(_widen(x1, kv_smem.dtype))
            if g < 2:
                box_view(kv_smem, stage * V_BOXES + 3 * g + 2).store(_widen(x2, kv_smem.dtype))
            else:
                box_view(smem.rope_smem, stage).store(_widen(x2, kv_smem.dtype))
            if (g + 1) % GROUPS_PER_FENCE == 0:
                fence_async_shared()
                gl.thread_barrier()
                for k in gl.static_range(3 * GROUPS_PER_FENCE):
                    box = 3 * (g + 1 - GROUPS_PER_FENCE) + k
                    mbarrier.arrive(smem.kv_ready.index(stage * NUM_BOXES + box), count=1)
        # Every thread has read raw stage `raw_stage` (the barrier above): refill it.
        if j + RAW_STAGES < num_tiles:
            raw.load(page_row, item.kv_start + (j + RAW_STAGES) * TILE_N, raw_stage, PAGE_SIZE)


@gluon.jit
def mla_sm90_fp8_partial_kernel(
    work_ptr, seq_lens_ptr, page_table_ptr, q_desc, raw_desc,
    out_ptr, lse_ptr, partial_out_ptr, partial_lse_ptr, kv_descale_ptr,
    stride_page_table_b, stride_ob, stride_os, stride_oh,
    num_heads, q_len, num_rows, softmax_scale_log2, output_scale,
    PAGE_SIZE: gl.constexpr, NUM_STAGES: gl.constexpr, HAS_DESCALE: gl.constexpr,
):
    """The partial results of one (row block, work item) from an e4m3 cache. Pointer layouts
    (element strides) as mla_sm90_partial_kernel's, except:
        raw_desc        TMA descriptor of the e4m3 cache [num_pages, PAGE_SIZE, 576], last dim
                        contiguous, boxes [1, 32 tokens, 64]
        kv_descale_ptr  float32 scalar, read only with HAS_DESCALE (else any valid pointer)
    output_scale multiplies the output and the factor it undoes is in softmax_scale_log2 (the
    bf16 widening's 2^-120)."""
    smem = Buffers.allocate(q_desc, NUM_STAGES, TILE_N)
    raw = RawRing.allocate(raw_desc)
    output = Output(out_ptr, lse_ptr, partial_out_ptr, partial_lse_ptr, stride_ob, stride_os,
                    stride_oh, num_heads, num_rows)
    scores = Scores(seq_lens_ptr, q_len, softmax_scale_log2, output_scale, kv_descale_ptr,
                    HAS_DESCALE)
    pages = Pages(page_table_ptr, stride_page_table_b, PAGE_SIZE)
    gl.warp_specialize([
        (softmax_partition, (work_ptr, smem, output, scores)),
        (pv_partition, (work_ptr, smem, output)),
        (_widen_partition, (work_ptr, smem, q_desc, raw, pages)),
    ], [4, 4], [PV_REGS, WIDEN_REGS])


def mla_sm90_fp8_launch(q, kv_cache, page_table, seq_lens, kv_descale, out, lse, plan,
                        softmax_scale: float) -> KernelLaunch:
    """The partial-kernel launch for an e4m3 cache that sm90.supports_plan() accepted."""
    # bf16: the widened values are 2^-120 x the cache's (_E4M3_TO_BF16_ASM); the scales undo it.
    widen_scale = BF16_WIDEN_SCALE if q.dtype == torch.bfloat16 else 1.0
    args = common_args(q, page_table, seq_lens, out, lse, plan, softmax_scale * widen_scale)
    args.update(raw_desc=kv_descriptor(kv_cache, TILE_N.value, GL_DTYPES[kv_cache.dtype]),
                kv_descale_ptr=kv_descale if kv_descale is not None else seq_lens,
                output_scale=widen_scale)
    num_rows = args["num_rows"]
    constexprs = dict(PAGE_SIZE=kv_cache.shape[1], NUM_STAGES=NUM_STAGES,
                      HAS_DESCALE=kv_descale is not None)
    grid = (-(-num_rows // BLOCK_M.value), plan.num_work)
    return KernelLaunch(mla_sm90_fp8_partial_kernel, grid, args, constexprs, 4, 1)

