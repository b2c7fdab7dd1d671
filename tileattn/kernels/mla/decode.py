"""MLA decode (DeepSeek multi-head latent attention) over a paged latent KV cache.

Every head attends to one shared latent cache row per token: 576 columns, of which the first
512 ("nope") are both the key's main part and the value, and the last 64 the rotary part. So
QK^T = q_nope · kv[:, :512]^T + q_pe · kv[:, 512:]^T (two dots of power-of-two width) and
P @ V uses kv[:, :512] again. Since every head reads the same rows, the q_len tokens × heads
of one sequence are folded into the M dimension of the MMA: one KV tile loaded from HBM feeds
heads·q_len rows, which is what makes 128 heads compute-bound rather than bandwidth-bound.

Two kernels:
  * mla_decode_partial_kernel — one program per (work item, block of rows, V column chunk).
    A work item is a contiguous chunk of one sequence's keys from the split-KV plan
    (tileattn.scheduler). A sequence with one chunk writes the final output and LSE directly;
    otherwise the chunk's normalised output and LSE go to an fp32 workspace slot.
  * mla_decode_combine_kernel (combine.py) — merges a sequence's slots by their LSEs.
This file holds the partial kernel, its config table and mla_decode_launches (both kernels'
launches, the partial one from this kernel or from the Gluon ones in sm90.py / sm90_fp8.py).
Which partial kernel runs where, and where an FP8 cache measured slower, is decided in
tileattn/dispatch.py (docs/design.md, "MLA decode").

Pointer layouts (element strides):
    q             [batch, q_len, num_heads, 576]    last dim contiguous; row r of a program's
                                                    M block is token r // num_heads, head r % num_heads
    kv            [num_pages, page_size, 576]       last dim contiguous; fp16/bf16 like q, or e4m3
    page_table    int32 [batch, max_pages]          row stride stride_page_table_b, column stride 1
    seq_lens      int32 [batch]                     contiguous
    work          int32 [num_work, 5]               contiguous rows (batch, kv_start, kv_end, slot,
                                                    seq_len the plan was made for)
    kv_descale    float32 scalar                    only read when HAS_DESCALE
    out           [batch, q_len, num_heads, 512]    last dim contiguous
    lse           float32 [batch, q_len, num_heads] contiguous, natural log
    partial_out   float32 [num_slots, num_rows, 512] contiguous (num_rows = q_len · num_heads)
    partial_lse   float32 [num_slots, num_rows]     contiguous, natural log
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...arch import Arch
from ..runtime import interpreter_active
from ..runtime import KernelLaunch
from ..split_kv_combine import COMBINE_MAX_SLOTS_PER_STEP, combine_launches
from ..softmax import online_softmax_probs

HEAD_DIM_NOPE = 512   # latent width; also V's width
HEAD_DIM_ROPE = 64
HEAD_DIM_QK = HEAD_DIM_NOPE + HEAD_DIM_ROPE
LOG2_E = 1.4426950408889634


@dataclass(frozen=True)
class MLAConfig:
    schedule: str      # "split_dv" or "dup_qk", see the table comment
    block_m: int       # rows (token × head pairs) per program, at most; fewer when H·q_len is small
    block_n: int       # KV tokens per tile
    dv_chunks: int     # programs sharing one row block, each owning 512 / dv_chunks V columns
    num_warps: int
    num_stages: int
    min_chunk: int     # fewest keys per split-KV work item (a smaller item's q load and partial
                       # write cost more than its keys)
    programs_per_sm: int = 1   # split-KV aims at this many resident programs per SM
    # FP8 cache only. fp8_reread_v: load V again (an L1/L2 hit) instead of reusing the K tile,
    # so each load has one MMA use and rides cp.async. fp8_in_f16: run the MMAs in fp16 (q
    # row-scaled) rather than q's dtype, one widening instruction per pair of values fewer.
    fp8_reread_v: bool = False
    fp8_in_f16: bool = False
    # fp8_v_chunks (FP8 cache with a re-read V): V is loaded, widened and multiplied in that
    # many column chunks, each into its own accumulator; fewer live registers at once, and a
    # chunk's fp16 staging buffer (below) is one chunk wide and reused.
    # fp8_v_asm_rows (also needs fp8_in_f16): in blocks of at most this many rows (0: never),
    # V is widened by inline PTX, which the compiler cannot move past the layout conversion to
    # the MMA operand (it does move its own widening there): the FP8 tile is then read from
    # shared memory in 16-byte rows, widened in registers, stored back as fp16 and read with
    # ldmatrix.trans, instead of byte by byte.
    fp8_v_asm_rows: int = 0
    fp8_v_chunks: int = 1

    def __post_init__(self):
        # More accumulator values a thread (e.g. 64 rows x 512 V columns on 4 warps: 256) ran
        # slower and one such build faulted with an illegal memory access (docs/design.md,
        # "MLA decode").
        per_thread = self.block_m * (HEAD_DIM_NOPE // self.dv_chunks) // (32 * self.num_warps)
        if per_thread > 128:
            raise ValueError(f"an MLA config may hold at most 128 accumulator values a thread, "
                             f"got {per_thread}: {self}")
        v_chunk = HEAD_DIM_NOPE // self.dv_chunks // self.fp8_v_chunks
        if v_chunk < 16 or v_chunk & (v_chunk - 1):
            raise ValueError(f"fp8_v_chunks must leave V chunks of a power of two >= 16 columns: "
                             f"{self}")


# (arch, schedule) -> config. Each row must fit the chip's shared memory with both a 16-bit and
# an FP8 cache; tests/test_mla_cross_compile.py compiles every row for its target.
#
# The schedule knob is the Triton rendering of the two schedules that matter on chips with
# little shared memory:
#   "split_dv": one program computes QK^T once for its block of rows and applies P to all 512
#     V columns. In CUDA this is the "split QK across warps and exchange P through shared
#     memory" schedule: the whole program shares one P, and the 64×512 fp32 accumulator is
#     spread over all its warps. Cost: the largest accumulator and the P exchange.
#   "dup_qk": the 512 V columns are split across dv_chunks programs, and each recomputes QK^T
#     for itself (no P exchange, half the accumulator per program). Cost: QK^T FLOPs and the
#     KV tile's L2 traffic are paid dv_chunks times (the second read usually hits L2).
# sm89 has 99 KB: a [block_m, 576] q plus one [block_n, 576] KV tile must fit with one stage.
#
# sm90 rows from a config sweep (docs/design.md, "MLA decode"): BLOCK_N 64 rather than 32
# halves the per-tile softmax and barrier work per key; 64-row blocks keep 8 warps (one
# warpgroup holding a 64x512 fp32 accumulator lost, and one such build faulted).
CONFIGS: dict[tuple[str, str], MLAConfig] = {
    ("sm90", "split_dv"): MLAConfig("split_dv", 64, 64, 1, 8, 2, 128),
    ("sm90", "dup_qk"): MLAConfig("dup_qk", 64, 32, 2, 4, 2, 128),
    ("sm80", "split_dv"): MLAConfig("split_dv", 64, 32, 1, 8, 2, 128),
    ("sm80", "dup_qk"): MLAConfig("dup_qk", 64, 32, 2, 4, 2, 128),
    # sm89: the FP8 knobs as on sm90's mma.sync rows (same code path; not measured on an sm89).
    ("sm89", "split_dv"): MLAConfig("split_dv", 32, 16, 1, 4, 1, 128, fp8_reread_v=True,
                                    fp8_in_f16=True, fp8_v_asm_rows=32),
    ("sm89", "dup_qk"): MLAConfig("dup_qk", 32, 16, 2, 4, 1, 128, fp8_in_f16=True,
                                  fp8_v_asm_rows=32),
    # The interpreter: small tiles so short test sequences still span several tiles and splits.
    ("cpu", "split_dv"): MLAConfig("split_dv", 16, 16, 1, 4, 1, 16),
    ("cpu", "dup_qk"): MLAConfig("dup_qk", 16, 16, 2, 4, 1, 16),
}
# Blocks of at most 32 rows (H·q_len <= 32) run on mma.sync, where one warpgroup of 4 warps
# beats two, and split-KV aims at two programs per SM to fill the chip (docs/design.md,
# "MLA decode").
#
# FP8 cache on mma.sync (these rows and sm89's): both fp8_ knobs on; on the wgmma rows both
# lost, so they stay off there (docs/design.md, "FP8 cache").
#
# fp8_v_chunks / fp8_v_asm_rows: without them V's mma.sync B fragment is read from shared
# memory byte by byte (V is token-major and sm90 has no 8-bit ldmatrix.trans; LDS.U8 in SASS)
# and the widened tile spills. With the inline-PTX widening V is read in 16-byte rows, widened
# in registers, stored as fp16 and read back with ldmatrix.trans; chunks keep it in registers.
# 8 chunks measured fastest; the asm stays off for 32-row blocks, where its fp16 staging tile
# leaves one program per SM (docs/design.md, "FP8 cache").
SMALL_BLOCK_CONFIGS: dict[tuple[str, str], MLAConfig] = {
    ("sm90", "split_dv"): MLAConfig("split_dv", 32, 64, 1, 4, 2, 128, programs_per_sm=2,
                                    fp8_reread_v=True, fp8_in_f16=True, fp8_v_asm_rows=16,
                                    fp8_v_chunks=8),
}
DEFAULT_SCHEDULE = {"sm90": "split_dv", "sm80": "split_dv", "sm89": "dup_qk", "cpu": "split_dv"}
# Chips whose rows are another chip's: same shared memory and MMA generation.
_SAME_CONFIGS_AS = {"sm86": "sm89", "sm120": "sm89", "sm87": "sm80", "sm100": "sm90",
                    "rocm": "sm80"}
SCHEDULES = ("split_dv", "dup_qk")


def config_for(arch: Arch, schedule: str | None = None, num_rows: int = 128) -> MLAConfig:
    """The row for a chip, schedule and H·q_len rows per sequence."""
    name = _SAME_CONFIGS_AS.get(arch.name, arch.name)
    key = (name, schedule or DEFAULT_SCHEDULE[name])
    small = SMALL_BLOCK_CONFIGS.get(key)
    if small is not None and num_rows <= small.block_m:
        return small
    return CONFIGS[key]


def rows_per_program(config: MLAConfig, num_rows: int) -> int:
    """BLOCK_M for H·q_len rows: the config's, or the smallest MMA-sized power of two above."""
    return min(config.block_m, max(16, 1 << (num_rows - 1).bit_length()))


def programs_per_work_item(config: MLAConfig, num_rows: int) -> int:
    return -(-num_rows // rows_per_program(config, num_rows)) * config.dv_chunks


@triton.jit
def _widen(kv, dtype: tl.constexpr, KV_WIDEN: tl.constexpr):
    """A KV tile in q's dtype. KV_WIDEN says how an FP8 cache is widened (see kv_widen_mode).

    "bytes": Triton has no e4m3 type for sm80 (no FP8 hardware there), so the cache arrives as
    uint8 and its sign, exponent and mantissa are moved into an fp32 by hand; e4m3's exponent
    bias is 7 against fp32's 127, hence the exact ×2^120. Subnormal e4m3 become fp32
    subnormals, which the multiply keeps (Triton does not flush to zero by default).
    """
    if KV_WIDEN == "via_f32":
        return kv.to(tl.float32).to(dtype)
    if KV_WIDEN == "bytes":
        bits = kv.to(tl.int32)
        widened = (((bits & 0x80) << 24) | ((bits & 0x7F) << 20)).to(tl.float32, bitcast=True)
        return (widened * 1.329227995784916e36).to(dtype)
    return kv.to(dtype)


@triton.jit
def _widen_v(v, dtype: tl.constexpr, KV_WIDEN: tl.constexpr, V_ASM: tl.constexpr):
    """V's tile in dtype; with V_ASM (e4m3 to fp16 only), by cvt.rn.f16x2.e4m3x2 in inline PTX
    (not pure, so that the compiler keeps it where it stands: see MLAConfig.fp8_v_asm_rows).
    Four values a call: bytes 0-1 of the packed input become the first output word."""
    if V_ASM:
        return tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; "
            "cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
            "=r,=r,r", [v.to(tl.uint8, bitcast=True)], dtype=tl.float16, is_pure=False, pack=4)
    return _widen(v, dtype, KV_WIDEN)


@triton.jit
def _attend_kv_tiles(
    acc, l_i, m_i, q_nope, q_pe, q_row_scale,
    kv_ptr, page_table_row, stride_kv_page, stride_kv_row,
    tile_start, tile_end, kv_end, key_limit, qk_scale, dv_offset, num_pages,
    PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, DV_BLOCK: tl.constexpr,
    MASKED: tl.constexpr, KV_WIDEN: tl.constexpr, REUSE_KV_AS_V: tl.constexpr,
    Q_ROW_SCALED: tl.constexpr, V_ASM: tl.constexpr, V_CHUNKS: tl.constexpr,
):
    """Online-softmax update of (acc, l_i, m_i) over KV tokens [tile_start, tile_end).
    acc is a tuple of V_CHUNKS accumulators, chunk c holding V columns
    dv_offset + c * DV_BLOCK // V_CHUNKS onwards."""
    VC_BLOCK: tl.constexpr = DV_BLOCK // V_CHUNKS
    offs_n = tl.arange(0, BLOCK_N)
    offs_nope = tl.arange(0, 512)
    offs_rope = 512 + tl.arange(0, 64)
    for start_n in tl.range(tile_start, tile_end, BLOCK_N):
        token = start_n + offs_n
        # Any page_size works: each token finds its own page. PAGE_SIZE is a compile-time
        # constant because an integer division by a runtime value per token cost a large part
        # of the bandwidth (docs/design.md, "Kernels and config rows").
        if MASKED:
            in_range = token < kv_end
            page = tl.load(page_table_row + token // PAGE_SIZE, mask=in_range, other=0)
        else:
            page = tl.load(page_table_row + token // PAGE_SIZE)
        # A page id outside the cache is never followed: it reads page 0 (the host checks ids
        # outside CUDA graph capture). Clamping is free; flagging the tile as well cost 57% of
        # the H16 time (docs/design.md, "Safety contract").
        page = tl.where((page < 0) | (page >= num_pages), 0, page)
        row_ptrs = kv_ptr + page.to(tl.int64) * stride_kv_page + (token % PAGE_SIZE).to(tl.int64) * stride_kv_row
        if MASKED:
            kv_nope = tl.load(row_ptrs[:, None] + offs_nope[None, :], mask=in_range[:, None], other=0.0)
            kv_rope = tl.load(row_ptrs[:, None] + offs_rope[None, :], mask=in_range[:, None], other=0.0)
        else:
            kv_nope = tl.load(row_ptrs[:, None] + offs_nope[None, :])
            kv_rope = tl.load(row_ptrs[:, None] + offs_rope[None, :])
        # An FP8 cache is read as FP8 (half the HBM bytes) and widened to q's dtype in
        # registers; its descale lives in qk_scale and in the final normalisation.
        kv_nope = _widen(kv_nope, q_nope.dtype, KV_WIDEN)
        kv_rope = _widen(kv_rope, q_nope.dtype, KV_WIDEN)
        qk = tl.dot(q_nope, tl.trans(kv_nope))
        qk = tl.dot(q_pe, tl.trans(kv_rope), qk)
        if Q_ROW_SCALED:
            qk = qk * q_row_scale[:, None]
        if MASKED:
            # key_limit already stops at the sequence end; in_range also guards the chunk end.
            visible = in_range[None, :] & (token[None, :] < key_limit[:, None])
            qk = tl.where(visible, qk, float("-inf"))
        p, alpha, l_i, m_new = online_softmax_probs(qk, m_i, l_i, qk_scale, MASKED)
        p = p.to(q_nope.dtype)
        # V_CHUNKS > 1 (re-read V only): one load, widening and MMA per column chunk, each into
        # its own accumulator, so that a chunk's fp16 staging buffer (V_ASM) can be reused.
        for c in tl.static_range(V_CHUNKS):
            if REUSE_KV_AS_V:
                v = kv_nope   # V is the tile already loaded for QK^T
            else:
                # dup_qk: this program owns a slice of V's columns; re-reading them (L1/L2 hits)
                # is cheaper than slicing a register tile, which Triton cannot do.
                # fp8_reread_v: on mma.sync, an FP8 tile feeding two MMAs through a widening is
                # not pipelined (the compiler loads it to registers and stores it to shared memory
                # itself); a second load for V gives each load one use, and both ride cp.async.
                # The eviction hint also keeps the compiler from merging it with the load above.
                offs_v = dv_offset + c * VC_BLOCK + tl.arange(0, VC_BLOCK)
                if MASKED:
                    v = tl.load(row_ptrs[:, None] + offs_v[None, :], mask=in_range[:, None],
                                other=0.0, eviction_policy="evict_first")
                else:
                    v = tl.load(row_ptrs[:, None] + offs_v[None, :], eviction_policy="evict_first")
                v = _widen_v(v, q_nope.dtype, KV_WIDEN, V_ASM)
            acc = acc[:c] + (tl.dot(p, v, acc[c] * alpha[:, None]),) + acc[c + 1:]
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def mla_decode_partial_kernel(
    q_ptr, kv_ptr, page_table_ptr, seq_lens_ptr, work_ptr, kv_descale_ptr,
    out_ptr, lse_ptr, partial_out_ptr, partial_lse_ptr,
    stride_qb, stride_qs, stride_qh,
    stride_kv_page, stride_kv_row, stride_page_table_b,
    stride_ob, stride_os, stride_oh,
    num_heads, q_len, num_rows, num_pages,
    softmax_scale_log2,
    PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DV_BLOCK: tl.constexpr,
    HAS_DESCALE: tl.constexpr, KV_WIDEN: tl.constexpr, REUSE_KV_AS_V: tl.constexpr,
    FP8_IN_F16: tl.constexpr, V_ASM: tl.constexpr, V_CHUNKS: tl.constexpr,
):
    # The programs of one work item (its row blocks x V column chunks) are adjacent in launch
    # order (grid axis 0), so the KV tiles that the first pulls from HBM are in L2 for the others.
    DV_CHUNKS: tl.constexpr = 512 // DV_BLOCK
    work_id = tl.program_id(1)
    row_block = tl.program_id(0) // DV_CHUNKS
    dv_offset = (tl.program_id(0) % DV_CHUNKS) * DV_BLOCK
    batch = tl.load(work_ptr + work_id * 5)
    kv_start = tl.load(work_ptr + work_id * 5 + 1)
    kv_end = tl.load(work_ptr + work_id * 5 + 2)
    slot = tl.load(work_ptr + work_id * 5 + 3)
    planned_seq_len = tl.load(work_ptr + work_id * 5 + 4)
    seq_len = tl.load(seq_lens_ptr + batch)

    offs_m = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_valid = offs_m < num_rows
    token = offs_m // num_heads
    head = offs_m % num_heads
    q_rows = (q_ptr + batch.to(tl.int64) * stride_qb + token.to(tl.int64) * stride_qs
              + head.to(tl.int64) * stride_qh)
    q_nope = tl.load(q_rows[:, None] + tl.arange(0, 512)[None, :], mask=row_valid[:, None], other=0.0)
    q_pe = tl.load(q_rows[:, None] + 512 + tl.arange(0, 64)[None, :], mask=row_valid[:, None], other=0.0)
    q_row_scale = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
    if FP8_IN_F16:
        # e4m3 widens to fp16 in one instruction per pair (bf16 takes a second one per value),
        # and fp16 keeps 3 more mantissa bits than bf16, but it overflows past 65504: each row
        # of q is divided by the power of two that brings its largest |value| under 2^14, and
        # its scores are multiplied back in the loop.
        q_amax = tl.maximum(tl.max(tl.abs(q_nope.to(tl.float32)), 1),
                            tl.max(tl.abs(q_pe.to(tl.float32)), 1))
        q_row_scale = tl.exp2(tl.maximum(tl.ceil(tl.log2(tl.maximum(q_amax, 1.0))) - 14.0, 0.0))
        q_nope = (q_nope.to(tl.float32) / q_row_scale[:, None]).to(tl.float16)
        q_pe = (q_pe.to(tl.float32) / q_row_scale[:, None]).to(tl.float16)

    qk_scale = softmax_scale_log2
    v_scale = 1.0
    if HAS_DESCALE:
        kv_descale = tl.load(kv_descale_ptr)
        qk_scale *= kv_descale
        v_scale = kv_descale

    # Speculative decoding: token j of q_len sees the first seq_len - q_len + 1 + j keys.
    first_limit = seq_len - q_len + 1
    key_limit = first_limit + token
    # Tiles below full_end are visible to every row and inside the chunk: no masks there.
    full_end = tl.maximum(tl.minimum(kv_end, first_limit), kv_start)
    full_end = kv_start + (full_end - kv_start) // BLOCK_N * BLOCK_N

    page_table_row = page_table_ptr + batch.to(tl.int64) * stride_page_table_b
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = ()
    for c in tl.static_range(V_CHUNKS):
        acc = acc + (tl.zeros([BLOCK_M, DV_BLOCK // V_CHUNKS], dtype=tl.float32),)
    acc, l_i, m_i = _attend_kv_tiles(
        acc, l_i, m_i, q_nope, q_pe, q_row_scale, kv_ptr, page_table_row, stride_kv_page, stride_kv_row,
        kv_start, full_end, kv_end, key_limit, qk_scale, dv_offset, num_pages,
        PAGE_SIZE, BLOCK_N, DV_BLOCK, False, KV_WIDEN, REUSE_KV_AS_V, FP8_IN_F16, V_ASM, V_CHUNKS)
    acc, l_i, m_i = _attend_kv_tiles(
        acc, l_i, m_i, q_nope, q_pe, q_row_scale, kv_ptr, page_table_row, stride_kv_page, stride_kv_row,
        full_end, kv_end, kv_end, key_limit, qk_scale, dv_offset, num_pages,
        PAGE_SIZE, BLOCK_N, DV_BLOCK, True, KV_WIDEN, REUSE_KV_AS_V, FP8_IN_F16, V_ASM, V_CHUNKS)

    # A row may see no key of a late chunk (its causal limit is below the chunk): output 0,
    # LSE -inf, which the combine weighs as 0. Every row sees key 0, so no final row is empty.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    # A plan made for other seq_lens gives NaN rows rather than a plausible wrong answer
    # (inside a CUDA graph nothing can raise).
    broken = planned_seq_len != seq_len
    row_scale = tl.where(broken, float("nan"), v_scale / l_safe)
    lse = tl.where(broken, float("nan"), lse)
    out_acc = ()
    for c in tl.static_range(V_CHUNKS):
        out_acc = out_acc + (acc[c] * row_scale[:, None],)
    VC_BLOCK: tl.constexpr = DV_BLOCK // V_CHUNKS
    if slot < 0:
        for c in tl.static_range(V_CHUNKS):
            offs_v = dv_offset + c * VC_BLOCK + tl.arange(0, VC_BLOCK)
            out_ptrs = (out_ptr + batch.to(tl.int64) * stride_ob + token.to(tl.int64)[:, None] * stride_os
                        + head.to(tl.int64)[:, None] * stride_oh + offs_v[None, :])
            tl.store(out_ptrs, out_acc[c].to(out_ptr.dtype.element_ty), mask=row_valid[:, None])
        if dv_offset == 0:
            tl.store(lse_ptr + batch.to(tl.int64) * num_rows + offs_m, lse, mask=row_valid)
    else:
        slot_rows = slot.to(tl.int64) * num_rows + offs_m
        for c in tl.static_range(V_CHUNKS):
            offs_v = dv_offset + c * VC_BLOCK + tl.arange(0, VC_BLOCK)
            tl.store(partial_out_ptr + slot_rows[:, None] * 512 + offs_v[None, :], out_acc[c],
                     mask=row_valid[:, None])
        if dv_offset == 0:
            tl.store(partial_lse_ptr + slot_rows, lse, mask=row_valid)


# Work items run on grid axis 1 (the programs of one item are adjacent on axis 0), and CUDA
# caps that axis at 65535 blocks; api.mla_plan refuses plans with more.
MAX_WORK_ITEMS = 65535
# The most work items (split-KV slots) a plan cuts one sequence into, while that keeps its items
# at most SPLIT_CAP_MAX_CHUNK keys long: the combine merges up to 64 slots in one pass, and short
# items pay their fixed cost (q load, rows x 512 fp32 written and read back) on few keys. Past
# 512-key items the cap would leave SMs idle, so it lets go (docs/design.md, "Split-KV plans").
SPLIT_CAP_MAX_CHUNK = 512
MAX_SPLITS_PER_SEQ = COMBINE_MAX_SLOTS_PER_STEP


def kv_widen_mode(arch: Arch, kv_dtype: torch.dtype, q_dtype: torch.dtype) -> str:
    """How the kernel turns an FP8 cache tile into q's dtype on this chip.

    sm80 has no e4m3 type in Triton at all ("bytes", decoded by hand). On sm89 Triton widens
    e4m3 to bf16 through f16 and a cvt.bf16.f16 that only sm90 has, so bf16 goes through fp32
    there ("via_f32"). Elsewhere the compiler's own conversion ("direct").
    """
    if kv_dtype != torch.float8_e4m3fn:
        return "direct"
    if not arch.has_fp8_mma:
        return "bytes"
    if not arch.has_wgmma and arch.name != "cpu" and q_dtype == torch.bfloat16:
        return "via_f32"
    return "direct"


def mla_decode_launches(q, kv_cache, page_table, seq_lens, kv_descale, out, lse, plan,
                        softmax_scale: float, arch: Arch,
                        kernel: str = "triton") -> list[KernelLaunch]:
    """The launches for checked inputs and a matching plan; running them in order writes
    `out` and `lse`. No host synchronisation, no allocation: the plan owns the workspace.
    kernel: the partial kernel, "triton" or "gluon" (api.mla_kernel_for decides)."""
    batch, q_len, num_heads, _ = q.shape
    config = plan.config
    if kernel == "gluon":
        if kv_cache.dtype == torch.float8_e4m3fn:
            from .sm90_fp8 import mla_sm90_fp8_launch
            partial = mla_sm90_fp8_launch(q, kv_cache, page_table, seq_lens, kv_descale, out,
                                          lse, plan, softmax_scale)
        else:
            from .sm90 import mla_sm90_launch
            partial = mla_sm90_launch(q, kv_cache, page_table, seq_lens, out, lse, plan,
                                      softmax_scale)
        return [partial] + combine_launches(q, out, lse, plan)
    kv_widen = kv_widen_mode(arch, kv_cache.dtype, q.dtype)
    if kv_widen == "bytes":
        kv_cache = kv_cache.view(torch.uint8)
    num_rows = q_len * num_heads
    block_m = rows_per_program(config, num_rows)
    fp8_in_f16 = config.fp8_in_f16 and kv_cache.dtype != q.dtype
    reuse_kv_as_v = config.dv_chunks == 1 and not (config.fp8_reread_v and kv_cache.dtype != q.dtype)
    # Inline PTX needs a compiled kernel and e4m3 conversions (sm89+, not "bytes").
    v_asm = (fp8_in_f16 and not reuse_kv_as_v and block_m <= config.fp8_v_asm_rows
             and kv_cache.dtype == torch.float8_e4m3fn and kv_widen != "bytes"
             and arch.name != "cpu" and not interpreter_active())
    args = dict(
        q_ptr=q, kv_ptr=kv_cache, page_table_ptr=page_table, seq_lens_ptr=seq_lens,
        work_ptr=plan.work, kv_descale_ptr=kv_descale, out_ptr=out, lse_ptr=lse,
        partial_out_ptr=plan.partial_out, partial_lse_ptr=plan.partial_lse,
        stride_qb=q.stride(0), stride_qs=q.stride(1), stride_qh=q.stride(2),
        stride_kv_page=kv_cache.stride(0), stride_kv_row=kv_cache.stride(1),
        stride_page_table_b=page_table.stride(0),
        stride_ob=out.stride(0), stride_os=out.stride(1), stride_oh=out.stride(2),
        num_heads=num_heads, q_len=q_len, num_rows=num_rows, num_pages=kv_cache.shape[0],
        softmax_scale_log2=softmax_scale * LOG2_E,
    )
    constexprs = dict(PAGE_SIZE=kv_cache.shape[1], BLOCK_M=block_m, BLOCK_N=config.block_n,
                      DV_BLOCK=HEAD_DIM_NOPE // config.dv_chunks,
                      HAS_DESCALE=kv_descale is not None, KV_WIDEN=kv_widen,
                      REUSE_KV_AS_V=reuse_kv_as_v,
                      FP8_IN_F16=fp8_in_f16, V_ASM=v_asm,
                      V_CHUNKS=(config.fp8_v_chunks if kv_cache.dtype != q.dtype
                                and not reuse_kv_as_v else 1))
    grid = (-(-num_rows // block_m) * config.dv_chunks, plan.num_work)
    launches = [KernelLaunch(mla_decode_partial_kernel, grid, args, constexprs,
                             config.num_warps, config.num_stages)]
    return launches + combine_launches(q, out, lse, plan)
