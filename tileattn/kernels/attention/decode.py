"""Paged GQA decode: a few queries per sequence over a long paged K/V cache, split-KV.

A decode step has q_len = 1..8 queries per sequence (the new token, or speculative tokens),
so a grid of one program per query block leaves most SMs idle and re-reads K/V once per query
head. Here one program owns one (work item, kv head): a work item is a contiguous chunk of one
sequence's keys from the split-KV plan (tileattn/scheduler/decode.py), and the program takes **every
query head of the kv head's GQA group and every query of the sequence** as the M rows of its
tile (row r = token r // GROUP_SIZE, head kv_head * GROUP_SIZE + r % GROUP_SIZE; 32/8 heads and
q_len 1 are 4 rows, padded to 16 for the MMA). So each K/V page of a kv head is read from HBM
once, and decode is bound by the cache's bandwidth, not by repeated reads.

A sequence of one work item writes the final output and LSE; otherwise items write normalised
fp32 partials that kernels/split_kv_combine.py (shared with MLA) merges by their LSEs. Keys are
found through the block table (one page id a key block when PAGE_ALIGNED); page ids are clamped
into the cache, so a bad id is never dereferenced; it is reported.

Safety net against a plan used with other inputs (see DecodePlan): every program compares the
key count it is given with the one its plan was made for, and its query count with the plan's
q_len. On any mismatch, a page id outside the cache, or cu_seqlens_q rows outside q, it writes
NaN (never a plausible wrong answer) and sets a bit of error_flags (ERROR_* below), which the
host reads outside the hot path (DecodePlan.check_errors, validate=True).

Pointer layouts (element strides):
    q              [total_q, num_q_heads, head_dim]               last dim contiguous
    k_cache        [num_pages, page_size, num_kv_heads, head_dim]   last dim contiguous
    v_cache        [num_pages, page_size, num_kv_heads, head_dim_v] last dim contiguous
    block_table    int32 [batch, max_pages]     row stride stride_block_table, column stride 1
    kv_lens        int32 [batch] key counts, or [batch + 1] cumulative (KV_LENS_CUMULATIVE)
    cu_seqlens_q   int32 [batch + 1]            sequence b's queries are q rows [cu[b], cu[b+1])
    planned_kv_lens int32 [batch]               the key counts the plan was made for
    work           int32 [num_work, 4]          rows (batch, kv_start, kv_end, slot); slot -1:
                                                the sequence's only item, written to out/lse
    error_flags    int32 [1]                    OR of ERROR_* bits
    *_descale      float32 [batch, heads] read through strides, or a scalar (strides 0)
    out            [total_q, num_q_heads, head_dim_v]   last dim contiguous
    lse            float32 [num_q_heads, total_q]       natural log, row stride stride_lse_head
    partial_out    float32 [num_slots, max_q_len * num_q_heads, head_dim_v] contiguous
    partial_lse    float32 [num_slots, max_q_len * num_q_heads]             contiguous
        (workspace row = token * num_q_heads + head, as the combine reads it)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...arch import FP8_DTYPES, Arch
from ..runtime import KernelLaunch
from .configs import SAME_CONFIGS_AS, descale_args, padded_head_dim
from ..mla.decode import _widen, kv_widen_mode
from ..split_kv_combine import split_kv_combine_launch
from ..softmax import online_softmax_probs

LOG2_E = tl.constexpr(1.4426950408889634)   # softmax runs in base 2
LN_2 = tl.constexpr(0.6931471805599453)     # and LSEs are natural logs

# Bits of a plan's error_flags (DecodePlan.check_errors names them).
ERROR_KV_LENS = 1        # a sequence's key count differs from the plan's
ERROR_Q_LENS = 2         # a sequence has more queries than the plan's q_len, or cu_seqlens_q
                         # points outside q
ERROR_PAGE_ID = 4        # a page id of a used block-table entry is outside the cache


@dataclass(frozen=True)
class DecodeConfig:
    block_n: int            # keys per tile (at most; a page-aligned tile shrinks to the page)
    num_warps: int
    num_stages: int
    min_chunk: int          # fewest keys per split-KV work item
    # Split-KV adds work items until the programs an SM holds have about this many KB of K/V
    # tile loads in flight (see programs_per_sm).
    inflight_kb_per_sm: int = 64
    max_block_m: int = 64   # rows per program; more rows (q_len x group) take more programs
    # Pages that are a multiple of 16 keys but smaller than block_n: False shrinks the key tile
    # to the page (one page-id load per tile); True keeps block_n and gathers each key row's
    # page. True on the GPU rows, not measured yet (benchmarks/decode.py --sweep compares
    # them, variant "page-tiles"): a 16-key tile of an FP8 cache moves 4 KB per loop
    # iteration, and the iteration's fixed work (barrier, waits, row max/sum, rescale, V's
    # byte-wise shared loads) would then cost about as many issue slots as an H100 SM has for
    # its 23 KB/us share of HBM; 64-key tiles spread it over 4x the bytes.
    gather_small_pages: bool = False


# (arch, head dim padded to a power of two) -> config. Every row must fit its chip with a
# 16-bit and an FP8 cache (tests/test_decode_cross_compile.py compiles them). First guesses,
# not measured yet: 3 stages give each program two K/V tile buffers (one loading while the
# other is used). Split-KV aims at inflight_kb_per_sm of loads in flight per SM: HBM needs
# bandwidth x latency / SMs, ~25-50 KB on an H100 (3.35 TB/s, 1-2 us loaded, 132 SMs), ~20-30
# KB on an A100 (2 TB/s, 108 SMs), less on sm89's GDDR; the rows ask for 2-4x that.
CONFIGS: dict[tuple[str, int], DecodeConfig] = {
    ("sm90", 64): DecodeConfig(64, 4, 3, 256, 128, gather_small_pages=True),
    ("sm90", 128): DecodeConfig(64, 4, 3, 256, 128, gather_small_pages=True),
    ("sm90", 256): DecodeConfig(32, 4, 3, 256, 128, gather_small_pages=True),
    ("sm80", 64): DecodeConfig(64, 4, 3, 256, 96, gather_small_pages=True),
    ("sm80", 128): DecodeConfig(64, 4, 3, 256, 96, gather_small_pages=True),
    ("sm80", 256): DecodeConfig(32, 4, 3, 256, 96, gather_small_pages=True),
    # sm86 / sm89 / sm120: 99 KB of shared memory.
    ("sm89", 64): DecodeConfig(64, 4, 3, 256, 64, gather_small_pages=True),
    ("sm89", 128): DecodeConfig(64, 4, 3, 256, 64, gather_small_pages=True),
    ("sm89", 256): DecodeConfig(32, 4, 3, 256, 64, max_block_m=32, gather_small_pages=True),
    # The interpreter: small tiles and chunks so that short test sequences span several tiles,
    # work items and row blocks.
    ("cpu", 64): DecodeConfig(16, 4, 1, 16, 1, max_block_m=16),
    ("cpu", 128): DecodeConfig(16, 4, 1, 16, 1, max_block_m=16),
    ("cpu", 256): DecodeConfig(16, 4, 1, 16, 1, max_block_m=16),
}
def config_for(arch: Arch, head_dim: int, head_dim_v: int) -> DecodeConfig:
    name = SAME_CONFIGS_AS.get(arch.name, arch.name)
    return CONFIGS[(name, padded_head_dim(max(head_dim, head_dim_v)))]


def key_tile(config: DecodeConfig, page_size: int) -> tuple[int, bool]:
    """(BLOCK_N, page_aligned) for a cache of page_size keys a page. Page-aligned: the largest
    power of two p <= config.block_n dividing page_size, if p >= 16 (the MMA's smallest K) and
    the config does not prefer gathering at full width; else each row is gathered, block_n wide."""
    tile = config.block_n
    while tile >= 16 and page_size % tile:
        tile //= 2
    if tile >= 16 and (tile == config.block_n or not config.gather_small_pages):
        return tile, True
    return config.block_n, False


def rows_per_program(config: DecodeConfig, num_rows: int) -> int:
    """BLOCK_M for q_len x group rows: the smallest MMA-sized power of two, up to the config's."""
    return min(config.max_block_m, max(16, 1 << (num_rows - 1).bit_length()))


def widen_mode(arch: Arch, dtype: torch.dtype, target: torch.dtype) -> str:
    """How the kernel turns a tile of `dtype` into `target` on this chip (see _widen_to).
    e4m3 as MLA decides (mla_decode.kv_widen_mode). e5m2 is the top byte of an fp16, and
    Triton's conversion of it needs sm89's cvt: older chips shift the bytes ("e5m2_bytes")."""
    if dtype == torch.float8_e5m2 and not arch.has_fp8_mma:
        return "e5m2_bytes"
    if dtype == torch.float8_e5m2:
        return kv_widen_mode(arch, torch.float8_e4m3fn, target)   # same conversion paths
    return kv_widen_mode(arch, dtype, target)


def compute_dtype(q_dtype: torch.dtype) -> torch.dtype:
    """The MMA operand type: q's own, or fp16 for an FP8 q (e4m3 and e5m2 widen to it exactly
    and stay in its range; fp16 keeps more of P's mantissa than bf16)."""
    return torch.float16 if q_dtype in FP8_DTYPES else q_dtype


# ---- the kernel -----------------------------------------------------------------------------

@triton.jit
def _widen_to(x, dtype: tl.constexpr, MODE: tl.constexpr):
    """A tile in dtype; MODE from widen_mode. "e5m2_bytes": x holds e5m2 bytes, which are
    exactly an fp16's top byte."""
    if MODE == "e5m2_bytes":
        return (x.to(tl.uint16) << 8).to(tl.float16, bitcast=True).to(tl.float32).to(dtype)
    return _widen(x, dtype, MODE)


@triton.jit
def _tile_pages(block_table_row, start_n, block_end, kv_end, offs_n,
                PAGE_SIZE: tl.constexpr, PAGE_ALIGNED: tl.constexpr):
    """The page ids of the key tile at start_n: one (PAGE_ALIGNED, the tile lies in one page)
    or one per key row. Nothing is read for a tile at or past block_end, nor for keys past
    kv_end, whose block-table entries may be garbage: they come back as page 0."""
    if PAGE_ALIGNED:
        pages = tl.load(block_table_row + start_n // PAGE_SIZE, mask=start_n < block_end,
                        other=0)
    else:
        keys = start_n + offs_n
        pages = tl.load(block_table_row + keys // PAGE_SIZE,
                        mask=(keys < kv_end) & (start_n < block_end), other=0)
    return pages


@triton.jit
def _attend_key_blocks(
    acc, l_i, m_i, fault, q, row_scale,
    k_head_ptr, v_head_ptr, block_table_row, stride_k_page, stride_k_row, stride_v_page,
    stride_v_row, offs_d, offs_dv, token, head, position,
    block_start, block_end, kv_end, batch, q_shift, window_left, window_right, num_pages,
    mod_args,
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    HEAD_DIM_V_PAD: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
    PAGE_ALIGNED: tl.constexpr, MASKED: tl.constexpr, LOCAL_LEFT: tl.constexpr,
    LOCAL_RIGHT: tl.constexpr, KV_WIDEN: tl.constexpr, SCORE_MOD: tl.constexpr,
    MASK_MOD: tl.constexpr,
):
    """Online-softmax update of (acc, l_i, m_i) over keys [block_start, block_end); MASKED
    tiles check the key bound kv_end, the window and MASK_MOD. row_scale [BLOCK_M] turns q·k
    into scores (softmax scale and descales; times log2(e) unless SCORE_MOD needs natural
    units first). position [BLOCK_M] is each row's bottom-right aligned query position."""
    offs_n = tl.arange(0, BLOCK_N)
    # Page ids are loaded one tile ahead: the K/V addresses of a tile then depend on a value
    # of the previous iteration, not on a load of their own, and Triton's pipeliner gives
    # K and V num_stages - 1 buffers (with the page-id load in the same iteration it gave
    # them one, so a program never loaded and computed at once).
    next_pages = _tile_pages(block_table_row, block_start, block_end, kv_end, offs_n,
                             PAGE_SIZE, PAGE_ALIGNED)
    for start_n in tl.range(block_start, block_end, BLOCK_N):
        keys = start_n + offs_n
        page = next_pages
        next_pages = _tile_pages(block_table_row, start_n + BLOCK_N, block_end, kv_end, offs_n,
                                 PAGE_SIZE, PAGE_ALIGNED)
        # Ids outside the cache are clamped into it (never dereferenced) and reported.
        fault = fault | ((page < 0) | (page >= num_pages)).to(tl.int32)   # reduced after the loops
        page = tl.minimum(tl.maximum(page, 0), num_pages - 1).to(tl.int64)
        if PAGE_ALIGNED:
            row = (start_n % PAGE_SIZE + offs_n).to(tl.int64)
        else:
            row = (keys % PAGE_SIZE).to(tl.int64)
        k_ptrs = (k_head_ptr + (page * stride_k_page + row * stride_k_row)[:, None]
                  + offs_d[None, :])
        v_ptrs = (v_head_ptr + (page * stride_v_page + row * stride_v_row)[:, None]
                  + offs_dv[None, :])
        k_mask = offs_d[None, :] < HEAD_DIM
        v_mask = offs_dv[None, :] < HEAD_DIM_V
        if MASKED:
            # Rows past the sequence may be another sequence's or never written (NaN): V must
            # load as 0, since 0 x NaN would poison the P @ V sum.
            k_mask = k_mask & (keys < kv_end)[:, None]
            v_mask = v_mask & (keys < kv_end)[:, None]
        if MASKED or HEAD_DIM != HEAD_DIM_PAD:
            k = tl.load(k_ptrs, mask=k_mask, other=0.0)
        else:
            k = tl.load(k_ptrs)
        # An FP8 cache is read as FP8 (half the HBM bytes) and widened to q's type in
        # registers; its descales live in row_scale and the final normalisation.
        qk = tl.dot(q, tl.trans(_widen_to(k, q.dtype, KV_WIDEN)))
        scores = qk * row_scale[:, None]
        if SCORE_MOD is not None:
            scores = SCORE_MOD(scores, batch, head[:, None], token[:, None], keys[None, :],
                               q_shift, mod_args) * LOG2_E
        if MASKED:
            visible = (keys < kv_end)[None, :]
            if LOCAL_RIGHT:
                visible = visible & (keys[None, :] <= position[:, None] + window_right)
            if LOCAL_LEFT:
                visible = visible & (keys[None, :] >= position[:, None] - window_left)
            if MASK_MOD is not None:
                visible = visible & MASK_MOD(batch, head[:, None], token[:, None], keys[None, :],
                                             q_shift, mod_args)
            scores = tl.where(visible, scores, float("-inf"))
        # A score hook may return -inf (flex masks by score): its rows need the safe softmax.
        p, alpha, l_i, m_i = online_softmax_probs(scores, m_i, l_i, 1.0,
                                                  MASKED or SCORE_MOD is not None)
        if MASKED or HEAD_DIM_V != HEAD_DIM_V_PAD:
            v = tl.load(v_ptrs, mask=v_mask, other=0.0)
        else:
            v = tl.load(v_ptrs)
        acc = tl.dot(p.to(q.dtype), _widen_to(v, q.dtype, KV_WIDEN), acc * alpha[:, None])
    return acc, l_i, m_i, fault


@triton.jit
def _poison_extra_queries(out_ptr, given_q_start, given_q_len, max_q_len, total_q, kv_head,
                          stride_o_token, stride_o_head, GROUP_SIZE: tl.constexpr,
                          BLOCK_M: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                          HEAD_DIM_V_PAD: tl.constexpr):
    """NaN into the outputs of a sequence's queries past the plan's q_len (no program computes
    them), for this kv head's query heads, where they lie inside out."""
    if (given_q_start >= 0) & (given_q_start < total_q):
        rows_end = tl.minimum(given_q_len, total_q - given_q_start) * GROUP_SIZE
        offs_dv = tl.arange(0, HEAD_DIM_V_PAD)
        nan = tl.full([BLOCK_M, HEAD_DIM_V_PAD], float("nan"), tl.float32)
        for first in range(max_q_len * GROUP_SIZE, rows_end, BLOCK_M):
            rows = first + tl.arange(0, BLOCK_M)
            out_rows = ((given_q_start + rows // GROUP_SIZE).to(tl.int64) * stride_o_token
                        + (kv_head * GROUP_SIZE + rows % GROUP_SIZE).to(tl.int64) * stride_o_head)
            tl.store(out_ptr + out_rows[:, None] + offs_dv[None, :],
                     nan.to(out_ptr.dtype.element_ty),
                     mask=(rows < rows_end)[:, None] & (offs_dv[None, :] < HEAD_DIM_V))


@triton.jit
def decode_partial_kernel(
    q_ptr, k_ptr, v_ptr, block_table_ptr, kv_lens_ptr, cu_seqlens_q_ptr, planned_kv_lens_ptr,
    work_ptr, error_flags_ptr, q_descale_ptr, k_descale_ptr, v_descale_ptr,
    out_ptr, lse_ptr, partial_out_ptr, partial_lse_ptr,
    stride_q_token, stride_q_head,
    stride_k_page, stride_k_row, stride_k_head,
    stride_v_page, stride_v_row, stride_v_head,
    stride_block_table, stride_o_token, stride_o_head, stride_lse_head,
    stride_q_descale_b, stride_q_descale_h, stride_k_descale_b, stride_k_descale_h,
    stride_v_descale_b, stride_v_descale_h,
    total_q, num_q_heads, num_kv_heads, max_q_len, num_row_blocks, num_pages,
    window_left, window_right, softmax_scale,
    mod_args,
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    HEAD_DIM_V_PAD: tl.constexpr, GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, PAGE_ALIGNED: tl.constexpr,
    KV_LENS_CUMULATIVE: tl.constexpr, LOCAL_LEFT: tl.constexpr, LOCAL_RIGHT: tl.constexpr,
    KV_WIDEN: tl.constexpr, Q_WIDEN: tl.constexpr, COMPUTE_DTYPE: tl.constexpr,
    SCORE_MOD: tl.constexpr, MASK_MOD: tl.constexpr,
):
    # kv heads vary fastest in launch order: the programs reading one sequence's pages run
    # side by side (one page holds every head's rows), then its row blocks, then work items.
    pid = tl.program_id(0)
    kv_head = pid % num_kv_heads
    row_block = (pid // num_kv_heads) % num_row_blocks
    work_id = pid // (num_kv_heads * num_row_blocks)
    batch = tl.load(work_ptr + work_id * 4)
    kv_start = tl.load(work_ptr + work_id * 4 + 1)
    kv_end = tl.load(work_ptr + work_id * 4 + 2)
    slot = tl.load(work_ptr + work_id * 4 + 3)

    # The plan's key count drives every read; the one given is only compared with it.
    seq_len = tl.load(planned_kv_lens_ptr + batch)
    if KV_LENS_CUMULATIVE:
        given_len = tl.load(kv_lens_ptr + batch + 1) - tl.load(kv_lens_ptr + batch)
    else:
        given_len = tl.load(kv_lens_ptr + batch)
    given_q_start = tl.load(cu_seqlens_q_ptr + batch)
    given_q_len = tl.load(cu_seqlens_q_ptr + batch + 1) - given_q_start
    error = tl.where(given_len != seq_len, 1, 0)                                # ERROR_KV_LENS
    q_outside = ((given_q_len < 0) | (given_q_len > max_q_len) | (given_q_start < 0)
                 | (given_q_start + given_q_len > total_q))
    error = error | tl.where(q_outside, 2, 0)                                   # ERROR_Q_LENS
    # Clamped so that even inconsistent offsets never address outside q and out.
    q_len = tl.minimum(tl.maximum(given_q_len, 0), tl.minimum(max_q_len, total_q))
    q_start = tl.minimum(tl.maximum(given_q_start, 0), total_q - q_len)

    if q_len == 0:   # no query to answer: no key to read
        kv_end = kv_start

    offs_m = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    token = offs_m // GROUP_SIZE
    head = kv_head * GROUP_SIZE + offs_m % GROUP_SIZE
    row_valid = token < q_len
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    offs_dv = tl.arange(0, HEAD_DIM_V_PAD)
    q_rows = (q_start + token).to(tl.int64) * stride_q_token + head.to(tl.int64) * stride_q_head
    q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :],
                mask=row_valid[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    q = _widen_to(q, COMPUTE_DTYPE, Q_WIDEN)

    # Scores in natural-log units are q·k x row_scale; the softmax works in base 2, so without
    # a score hook log2(e) is folded in here (with one, the loop applies it after the hook).
    row_scale = tl.full([BLOCK_M], softmax_scale, tl.float32)
    if q_descale_ptr is not None:
        row_scale *= tl.load(q_descale_ptr + batch * stride_q_descale_b
                             + head * stride_q_descale_h)
    if k_descale_ptr is not None:
        row_scale *= tl.load(k_descale_ptr + batch * stride_k_descale_b
                             + kv_head * stride_k_descale_h)
    v_scale = 1.0
    if v_descale_ptr is not None:
        v_scale = tl.load(v_descale_ptr + batch * stride_v_descale_b
                          + kv_head * stride_v_descale_h)
    if SCORE_MOD is None:
        row_scale *= LOG2_E

    # Query `token` sits at key position token + q_shift (bottom-right aligned). Keys in
    # [full_start, full_end) are visible to every row of the tile: no masks there. The causal
    # mask is LOCAL_RIGHT with window_right 0.
    q_shift = seq_len - q_len
    position = token + q_shift
    seen_by_all_from = kv_start
    if LOCAL_LEFT:
        seen_by_all_from = tl.maximum(seq_len - 1 - window_left, kv_start)
    seen_by_all_to = kv_end
    if LOCAL_RIGHT:
        seen_by_all_to = tl.minimum(q_shift + window_right + 1, kv_end)
    full_start = kv_start + tl.cdiv(seen_by_all_from - kv_start, BLOCK_N) * BLOCK_N
    full_start = tl.minimum(full_start, kv_end)
    full_end = full_start + tl.maximum(seen_by_all_to - full_start, 0) // BLOCK_N * BLOCK_N

    k_head_ptr = k_ptr + kv_head.to(tl.int64) * stride_k_head
    v_head_ptr = v_ptr + kv_head.to(tl.int64) * stride_v_head
    block_table_row = block_table_ptr + batch.to(tl.int64) * stride_block_table
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_V_PAD], tl.float32)
    fault = tl.zeros([BLOCK_N], tl.int32)
    FULL_MASKED: tl.constexpr = MASK_MOD is not None   # a mask hook may hide any key
    if LOCAL_LEFT:
        acc, l_i, m_i, fault = _attend_key_blocks(
            acc, l_i, m_i, fault, q, row_scale, k_head_ptr, v_head_ptr, block_table_row,
            stride_k_page, stride_k_row, stride_v_page, stride_v_row, offs_d, offs_dv, token,
            head, position, kv_start, full_start, kv_end, batch, q_shift, window_left,
            window_right, num_pages, mod_args, HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD,
            HEAD_DIM_V_PAD, BLOCK_N, PAGE_SIZE, PAGE_ALIGNED, True, LOCAL_LEFT, LOCAL_RIGHT,
            KV_WIDEN, SCORE_MOD, MASK_MOD)
    acc, l_i, m_i, fault = _attend_key_blocks(
        acc, l_i, m_i, fault, q, row_scale, k_head_ptr, v_head_ptr, block_table_row,
        stride_k_page, stride_k_row, stride_v_page, stride_v_row, offs_d, offs_dv, token, head,
        position, full_start, full_end, kv_end, batch, q_shift, window_left, window_right,
        num_pages, mod_args, HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD, HEAD_DIM_V_PAD, BLOCK_N,
        PAGE_SIZE, PAGE_ALIGNED, FULL_MASKED, LOCAL_LEFT, LOCAL_RIGHT, KV_WIDEN, SCORE_MOD,
        MASK_MOD)
    acc, l_i, m_i, fault = _attend_key_blocks(
        acc, l_i, m_i, fault, q, row_scale, k_head_ptr, v_head_ptr, block_table_row,
        stride_k_page, stride_k_row, stride_v_page, stride_v_row, offs_d, offs_dv, token, head,
        position, full_end, kv_end, kv_end, batch, q_shift, window_left, window_right,
        num_pages, mod_args, HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD, HEAD_DIM_V_PAD, BLOCK_N,
        PAGE_SIZE, PAGE_ALIGNED, True, LOCAL_LEFT, LOCAL_RIGHT, KV_WIDEN, SCORE_MOD, MASK_MOD)
    error = error | tl.where(tl.max(fault, 0) != 0, 4, 0)                       # ERROR_PAGE_ID

    # A row that sees no key of this item outputs 0 with LSE -inf (the combine weighs it 0).
    # Any error outputs NaN instead: a plan used with other inputs must not look right.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(l_safe)) * LN_2)
    out = acc * (v_scale / l_safe)[:, None]
    if error != 0:
        out = tl.full([BLOCK_M, HEAD_DIM_V_PAD], float("nan"), tl.float32)
        lse = tl.full([BLOCK_M], float("nan"), tl.float32)
        tl.atomic_or(error_flags_ptr, error)
        if row_block == 0:
            _poison_extra_queries(out_ptr, given_q_start, given_q_len, max_q_len, total_q,
                                  kv_head, stride_o_token, stride_o_head, GROUP_SIZE, BLOCK_M,
                                  HEAD_DIM_V, HEAD_DIM_V_PAD)
    store_mask = row_valid[:, None] & (offs_dv[None, :] < HEAD_DIM_V)
    if slot < 0:
        out_rows = ((q_start + token).to(tl.int64) * stride_o_token
                    + head.to(tl.int64) * stride_o_head)
        tl.store(out_ptr + out_rows[:, None] + offs_dv[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=store_mask)
        if lse_ptr is not None:
            tl.store(lse_ptr + head.to(tl.int64) * stride_lse_head + q_start + token, lse,
                     mask=row_valid)
    else:
        slot_rows = (slot.to(tl.int64) * max_q_len + token) * num_q_heads + head
        tl.store(partial_out_ptr + slot_rows[:, None] * HEAD_DIM_V + offs_dv[None, :], out,
                 mask=store_mask)
        tl.store(partial_lse_ptr + slot_rows, lse, mask=row_valid)


def decode_launches(q, k_cache, v_cache, block_table, kv_lens, kv_lens_cumulative: bool,
                    cu_seqlens_q, out, lse, plan, *, softmax_scale: float, window_left: int,
                    window_right: int, q_descale=None, k_descale=None, v_descale=None,
                    score_mod=None, mask_mod=None, mod_args=(), arch: Arch) -> list[KernelLaunch]:
    """The launches (partial kernel, then the combine where some sequence has several work
    items) for checked inputs and a plan that matches them; running them in order writes out
    and lse (lse may be None). No host synchronisation, no allocation: the plan owns the
    workspace and, when cu_seqlens_q is None, the uniform query offsets.

    window_left / window_right: -1 for no bound; causal is window_right = 0.
    """
    total_q, num_q_heads, head_dim = q.shape
    num_pages, page_size, num_kv_heads, _ = k_cache.shape
    head_dim_v = v_cache.shape[3]
    group = num_q_heads // num_kv_heads
    config = plan.config
    block_n, page_aligned = plan.block_n, plan.page_aligned
    block_m = rows_per_program(config, plan.q_len * group)
    num_row_blocks = -(-plan.q_len * group // block_m)
    dot_dtype = compute_dtype(q.dtype)
    kv_widen = widen_mode(arch, k_cache.dtype, dot_dtype)
    q_widen = widen_mode(arch, q.dtype, dot_dtype)
    # Without FP8 hardware Triton cannot convert FP8 types: such tensors are read as bytes.
    if kv_widen in ("bytes", "e5m2_bytes"):
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    if q_widen in ("bytes", "e5m2_bytes"):
        q = q.view(torch.uint8)
    q_descale, sqb, sqh = descale_args(q_descale)
    k_descale, skb, skh = descale_args(k_descale)
    v_descale, svb, svh = descale_args(v_descale)
    if cu_seqlens_q is None:
        cu_seqlens_q = plan.cu_seqlens_q_uniform
    args = dict(
        q_ptr=q, k_ptr=k_cache, v_ptr=v_cache, block_table_ptr=block_table,
        kv_lens_ptr=kv_lens, cu_seqlens_q_ptr=cu_seqlens_q, planned_kv_lens_ptr=plan.kv_lens,
        work_ptr=plan.work, error_flags_ptr=plan.error_flags, q_descale_ptr=q_descale,
        k_descale_ptr=k_descale, v_descale_ptr=v_descale, out_ptr=out, lse_ptr=lse,
        partial_out_ptr=plan.partial_out, partial_lse_ptr=plan.partial_lse,
        stride_q_token=q.stride(0), stride_q_head=q.stride(1),
        stride_k_page=k_cache.stride(0), stride_k_row=k_cache.stride(1),
        stride_k_head=k_cache.stride(2),
        stride_v_page=v_cache.stride(0), stride_v_row=v_cache.stride(1),
        stride_v_head=v_cache.stride(2),
        stride_block_table=block_table.stride(0), stride_o_token=out.stride(0),
        stride_o_head=out.stride(1), stride_lse_head=lse.stride(0) if lse is not None else 0,
        stride_q_descale_b=sqb, stride_q_descale_h=sqh, stride_k_descale_b=skb,
        stride_k_descale_h=skh, stride_v_descale_b=svb, stride_v_descale_h=svh,
        total_q=total_q, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
        max_q_len=plan.q_len, num_row_blocks=num_row_blocks, num_pages=num_pages,
        window_left=window_left, window_right=window_right, softmax_scale=float(softmax_scale),
        mod_args=tuple(mod_args),
    )
    constexprs = dict(
        HEAD_DIM=head_dim, HEAD_DIM_V=head_dim_v, HEAD_DIM_PAD=padded_head_dim(head_dim),
        HEAD_DIM_V_PAD=padded_head_dim(head_dim_v), GROUP_SIZE=group, BLOCK_M=block_m,
        BLOCK_N=block_n, PAGE_SIZE=page_size, PAGE_ALIGNED=page_aligned,
        KV_LENS_CUMULATIVE=kv_lens_cumulative, LOCAL_LEFT=window_left >= 0,
        LOCAL_RIGHT=window_right >= 0, KV_WIDEN=kv_widen, Q_WIDEN=q_widen,
        COMPUTE_DTYPE=_TL_DTYPES[dot_dtype], SCORE_MOD=score_mod, MASK_MOD=mask_mod,
    )
    grid = (plan.num_work * num_row_blocks * num_kv_heads,)
    launches = [KernelLaunch(decode_partial_kernel, grid, args, constexprs,
                             config.num_warps, config.num_stages)]
    if plan.num_slots > 0:
        launches.append(split_kv_combine_launch(
            plan, out, lse, batch=plan.batch, num_heads=num_q_heads, q_len=plan.q_len,
            head_dim_v=head_dim_v, out_strides=(0, out.stride(0), out.stride(1)),
            lse_strides=(0, 1, lse.stride(0)) if lse is not None else (0, 0, 0),
            cu_seqlens_q=cu_seqlens_q))
    return launches


_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}
