"""MLA decode partial kernel for Hopper (sm90) in Gluon with an FP8 (e4m3) cache: the cache is
read from HBM as e4m3 (half the bytes of bf16) and widened to q's 16-bit type in shared
memory, so both GEMMs run on the same 16-bit wgmma as mla_sm90.py and q keeps its precision.

Same plan, inputs and outputs as mla_sm90.py (its docstring has the pointer layouts and the
causal rule); its softmax and P V partitions are reused as they are. What differs:
  * widen partition (4 warps, replaces the 1-warp loader): TMA loads of the e4m3 tile (9 boxes
    of [32 tokens, 64 cols], one "raw" barrier per tile) into a RAW_STAGES ring; then each box
    is read into registers, converted to 16 bits and stored into the NUM_STAGES ring of 16-bit
    tiles that the consumers read, with one "ready" barrier per box (the consumers start
    Q K^T on box 0 while the rest are widened). Once a raw tile is read, the same warps
    refill it with the tile RAW_STAGES ahead.
  * TILE_N = 32 tokens: a 16-bit tile is 36 KB, so Q (72 KB) + 3 widened tiles (108 KB) + 2
    raw tiles (36 KB) + P fit in 227 KB; 64-token tiles would leave no room for the raw ring.
  * The descale is not applied while widening: it multiplies the softmax scale and the output
    (the softmax partition's HAS_DESCALE), so widening is a plain type conversion.
Register split: softmax 256 + P V 200 + widen 48 = 504 (3 warpgroups x 168).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from ..runtime import KernelLaunch
from ..gluon_common import GL_DTYPES
from .sm90 import kv_descriptor, common_args
from .sm90_consumers import (BLOCK_M, BOX, NUM_BOXES, V_BOXES, allocate_state, box_view, load_q,
                                 pv_partition, softmax_partition, work_item)

TILE_N = gl.constexpr(32)     # KV tokens per tile (see the module docstring)
NUM_STAGES = 3                # widened 16-bit tiles
RAW_STAGES = gl.constexpr(2)  # e4m3 tiles as loaded
# softmax 256 + P V 200 + widen 48 = 504 (3 warpgroups x 168); at 208 / 40 the widen
# warps spilled 8 bytes.
PV_REGS = 200
WIDEN_REGS = 48


# e4m3 -> bf16 without a conversion instruction: sign to bit 15, the 7 exponent-and-mantissa
# bits to bits 10-4. The bf16 exponent field then equals e4m3's, so every value (subnormals and
# zero included) comes out exactly 2^-120 times the e4m3 value; BF16_WIDEN_SCALE = 2^120 goes
# into the softmax and output scales. Five integer ops per two values, where Triton's
# conversion goes through fp16 and one F2F.BF16.F16 per value on the slow conversion pipe
# (SASS; ncu: the widen warps were the bottleneck). e4m3 NaN (0x7f) comes out finite; past-
# the-end rows are zeroed by the softmax warpgroup anyway.
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


@gluon.jit
def _load_raw(raw_desc, raw_smem, raw_ready, page_row, token, raw_stage,
              PAGE_SIZE: gl.constexpr):
    """TMA of the e4m3 tile at `token` (9 boxes, one barrier) into raw stage `raw_stage`."""
    page = gl.load(page_row + token // PAGE_SIZE)
    bar = raw_ready.index(raw_stage)
    mbarrier.expect(bar, NUM_BOXES * raw_desc.block_type.nbytes)
    for c in gl.static_range(NUM_BOXES):
        tma.async_copy_global_to_shared(raw_desc, [page, token % PAGE_SIZE, c * BOX], bar,
                                        raw_smem.index(raw_stage * NUM_BOXES + c))


@gluon.jit
def _widen_partition(work_ptr, page_table_ptr, stride_page_table_b, q_desc, raw_desc,
                     q_smem, raw_smem, kv_smem, rope_smem, q_ready, raw_ready, kv_ready, kv_empty,
                     PAGE_SIZE: gl.constexpr, NUM_STAGES: gl.constexpr):
    batch, kv_start, kv_end, slot = work_item(work_ptr)
    load_q(q_desc, q_smem, q_ready, batch)
    page_row = page_table_ptr + batch.to(gl.int64) * stride_page_table_b
    num_tiles = gl.cdiv(kv_end - kv_start, TILE_N)
    for j in range(gl.minimum(RAW_STAGES, num_tiles)):
        _load_raw(raw_desc, raw_smem, raw_ready, page_row, kv_start + j * TILE_N, j, PAGE_SIZE)
    # 16 e4m3 (16 bytes) per thread per load: a [32, 64] box in one pass of 128 threads.
    box_layout: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
    for j in range(num_tiles):
        raw_stage = j % RAW_STAGES
        stage = j % NUM_STAGES
        mbarrier.wait(kv_empty.index(stage), ((j // NUM_STAGES) & 1) ^ 1)
        mbarrier.wait(raw_ready.index(raw_stage), (j // RAW_STAGES) & 1)
        # Three boxes per fence + barrier round trip, all three loaded before any is stored
        # (the loads would otherwise wait behind the stores: smem accesses stay in order).
        for g in gl.static_range(NUM_BOXES // 3):
            first = raw_stage * NUM_BOXES + 3 * g
            x0 = box_view(raw_smem, first).load(box_layout)
            x1 = box_view(raw_smem, first + 1).load(box_layout)
            x2 = box_view(raw_smem, first + 2).load(box_layout)
            box_view(kv_smem, stage * V_BOXES + 3 * g).store(_widen(x0, kv_smem.dtype))
            box_view(kv_smem, stage * V_BOXES + 3 * g + 1).store(_widen(x1, kv_smem.dtype))
            if g < 2:
                box_view(kv_smem, stage * V_BOXES + 3 * g + 2).store(_widen(x2, kv_smem.dtype))
            else:
                box_view(rope_smem, stage).store(_widen(x2, kv_smem.dtype))
            fence_async_shared()
            gl.thread_barrier()
            for k in gl.static_range(3):
                mbarrier.arrive(kv_ready.index(stage * NUM_BOXES + 3 * g + k), count=1)
        # Every thread has read raw stage `raw_stage` (the barrier above): refill it.
        if j + RAW_STAGES < num_tiles:
            _load_raw(raw_desc, raw_smem, raw_ready, page_row, kv_start + (j + RAW_STAGES) * TILE_N,
                      raw_stage, PAGE_SIZE)


@gluon.jit
def mla_sm90_fp8_partial_kernel(
    work_ptr, seq_lens_ptr, page_table_ptr, q_desc, raw_desc,
    out_ptr, lse_ptr, partial_out_ptr, partial_lse_ptr, kv_descale_ptr,
    stride_page_table_b, stride_ob, stride_os, stride_oh,
    num_heads, q_len, num_rows, softmax_scale_log2, output_scale,
    PAGE_SIZE: gl.constexpr, NUM_STAGES: gl.constexpr, HAS_DESCALE: gl.constexpr,
    PV_REGS: gl.constexpr, WIDEN_REGS: gl.constexpr,
):
    (q_smem, kv_smem, rope_smem, p_smem, alpha_smem, q_ready, p_ready, p_empty, kv_ready,
     kv_empty) = allocate_state(q_desc, NUM_STAGES, TILE_N)
    raw_smem = gl.allocate_shared_memory(raw_desc.dtype, [RAW_STAGES * NUM_BOXES] + raw_desc.block_type.shape,
                                         raw_desc.layout)
    raw_ready = gl.allocate_shared_memory(gl.int64, [RAW_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(RAW_STAGES):
        mbarrier.init(raw_ready.index(i), count=1)

    gl.warp_specialize([
        (softmax_partition, (work_ptr, seq_lens_ptr, out_ptr, lse_ptr, partial_out_ptr,
                              partial_lse_ptr, stride_ob, stride_os, stride_oh, num_heads, q_len,
                              num_rows, softmax_scale_log2, output_scale, kv_descale_ptr,
                              q_smem, kv_smem,
                              rope_smem, p_smem, alpha_smem, q_ready, kv_ready, kv_empty,
                              p_ready, p_empty, NUM_STAGES, HAS_DESCALE)),
        (pv_partition, (work_ptr, out_ptr, partial_out_ptr, stride_ob, stride_os, stride_oh,
                         num_heads, num_rows, kv_smem, p_smem, alpha_smem,
                         kv_ready, kv_empty, p_ready, p_empty, NUM_STAGES)),
        (_widen_partition, (work_ptr, page_table_ptr, stride_page_table_b, q_desc, raw_desc,
                            q_smem, raw_smem, kv_smem, rope_smem, q_ready, raw_ready, kv_ready,
                            kv_empty, PAGE_SIZE, NUM_STAGES)),
    ], [4, 4], [PV_REGS, WIDEN_REGS])


def mla_sm90_fp8_launch(q, kv_cache, page_table, seq_lens, kv_descale, out, lse, plan,
                        softmax_scale: float) -> KernelLaunch:
    """The partial-kernel launch for an e4m3 cache that mla_sm90.supports() accepted."""
    # bf16: the widened values are 2^-120 x the cache's (_E4M3_TO_BF16_ASM); the scales undo it.
    widen_scale = BF16_WIDEN_SCALE if q.dtype == torch.bfloat16 else 1.0
    args = common_args(q, page_table, seq_lens, out, lse, plan, softmax_scale * widen_scale)
    args.update(raw_desc=kv_descriptor(kv_cache, TILE_N.value, GL_DTYPES[kv_cache.dtype]),
                kv_descale_ptr=kv_descale if kv_descale is not None else seq_lens,
                output_scale=widen_scale)
    num_rows = args["num_rows"]
    constexprs = dict(PAGE_SIZE=kv_cache.shape[1], NUM_STAGES=NUM_STAGES,
                      HAS_DESCALE=kv_descale is not None, PV_REGS=PV_REGS,
                      WIDEN_REGS=WIDEN_REGS)
    grid = (-(-num_rows // BLOCK_M.value), plan.num_work)
    return KernelLaunch(mla_sm90_fp8_partial_kernel, grid, args, constexprs, 4, 1)

