"""Portable Triton forward attention (FP16/BF16/FP8) for sm80 and newer, and the interpreter.

One program computes one BLOCK_M tile of queries for one (sequence, query head). The keys it
visits come in segments (masks.key_blocks): blocks every query of the tile sees in full run
without masking work; the blocks that cross the sequence end, the causal diagonal or a window
edge are masked. With a block mask (FlexAttention's BlockMask) the tile visits the listed
partial blocks (mask hook applied) and full blocks instead. Softmax is online in base 2 with
fp32 statistics; FP8 descales are folded into the softmax scale (q, k) and into the final
normalisation (v), so the inner loop does no extra multiplies, and FP8 P is made with an
offset that keeps it in e4m3's normal range (softmax.online_softmax_step).

Score hooks (SCORE_MOD, MASK_MOD, mod_args: docs/design.md, "Mods") see natural-log scores
q·k·scale and positions within the sequence; the built-in softcap and ALiBi are such hooks
(kernels/mods.py).

Layouts (element strides; every tensor may come from a larger fused buffer):
    dense:  q [batch, seqlen_q, num_q_heads, head_dim], k [batch, seqlen_k, num_kv_heads,
            head_dim], v [batch, seqlen_k, num_kv_heads, head_dim_v], out [batch, seqlen_q,
            num_q_heads, head_dim_v], lse float32 [batch, num_q_heads, seqlen_q]
    varlen (IS_VARLEN): q [total_q, num_q_heads, head_dim] and out likewise, k/v [total_k,
            num_kv_heads, head_dim(_v)], lse float32 [num_q_heads, total_q]; sequence b is
            rows cu_seqlens_q[b]..cu_seqlens_q[b+1] (int32 [batch + 1]) of q, likewise k/v;
            with V_ALIGNED, v is fp8.packed_k_major_copy's (rows from packed_v_start(b))
    paged (PAGE_SIZE > 0): k/v [num_pages, PAGE_SIZE, num_kv_heads, head_dim(_v)] with
            block_table int32 [batch, max_pages] (row stride stride_block_table_b)
    q, k, out: last dim contiguous; v: last dim contiguous, or (dense) seqlen dim contiguous
    *_descale float32 [batch, heads] with strides, or a scalar read through strides 0; q's and
            k's (dense) also [batch, heads, ceil(seqlen / 128)], one per 128-row block
    block mask (BLOCK_MASK_Q > 0): kv_num_blocks / full_kv_num_blocks int32 [B, H, q_blocks]
            and kv_indices / full_kv_indices int32 [B, H, q_blocks, kv_blocks], B and H
            broadcast through stride 0; blocks of BLOCK_MASK_Q queries x BLOCK_MASK_KV keys
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...arch import Arch
from ...scheduler import heads_per_group
from .. import mods
from ..runtime import KernelLaunch
from .configs import (DESCALE_BLOCK_ROWS, SAME_CONFIGS_AS, TileConfig, block_descale_stride,
                      descale_args, padded_head_dim)
from .fwd_loops import attend_block_list, attend_key_blocks
from .layout import V_ALIGN, packed_v_start
from .masks import key_blocks, load_tile

LOG2_E = 1.4426950408889634
_LN_2 = tl.constexpr(0.6931471805599453)
# FP8 P is exp2(s - max + FP8_P_OFFSET): it spans [0, 256], below e4m3's 448 (FA3's Max_offset).
FP8_P_OFFSET = 8.0


# (arch, padded head_dim, fp8?) -> tile config. Each row must fit the chip's shared memory;
# tests/test_cross_compile.py compiles every row for its target and checks metadata.shared.
# sm90 rows: the fastest candidate of a tile sweep (docs/design.md, "Portable forward kernel");
# sm80 / sm89 rows are chosen to fit their shared memory, not yet measured.
CONFIGS: dict[tuple[str, int, bool], TileConfig] = {
    ("sm90", 64, False): TileConfig(128, 64, 8, 3),
    ("sm90", 128, False): TileConfig(64, 64, 4, 3),
    ("sm90", 256, False): TileConfig(128, 64, 8, 2),
    ("sm90", 64, True): TileConfig(64, 64, 4, 3),
    ("sm90", 128, True): TileConfig(64, 128, 4, 3),
    ("sm90", 256, True): TileConfig(128, 128, 8, 3),
    # sm80 / sm87: 163 KB, mma.sync; no FP8.
    ("sm80", 64, False): TileConfig(128, 64, 4, 3),
    ("sm80", 128, False): TileConfig(128, 64, 8, 3),
    ("sm80", 256, False): TileConfig(64, 64, 4, 2),
    # sm86 / sm89 / sm120: 99 KB, so fewer stages and narrower key tiles at large head dims.
    ("sm89", 64, False): TileConfig(128, 64, 4, 2),
    ("sm89", 128, False): TileConfig(64, 64, 4, 2),
    ("sm89", 256, False): TileConfig(64, 32, 4, 2),
    ("sm89", 64, True): TileConfig(128, 64, 4, 2),
    ("sm89", 128, True): TileConfig(128, 64, 8, 2),
    ("sm89", 256, True): TileConfig(64, 64, 4, 2),
    # The interpreter: small tiles so that short test sequences still span several blocks.
    ("cpu", 64, False): TileConfig(32, 16, 4, 1),
    ("cpu", 128, False): TileConfig(32, 16, 4, 1),
    ("cpu", 256, False): TileConfig(16, 16, 4, 1),
}
# Under a causal mask, rows that measured faster than the non-causal row but slower without the
# mask, so they apply to causal calls only (docs/design.md, "Portable forward kernel").
CAUSAL_CONFIGS: dict[tuple[str, int, bool], TileConfig] = {
    ("sm90", 128, True): TileConfig(128, 128, 8, 3),
}
def config_for(arch: Arch, head_dim: int, head_dim_v: int, is_fp8: bool,
               causal: bool = False) -> TileConfig:
    name = SAME_CONFIGS_AS.get(arch.name, arch.name)
    width = padded_head_dim(max(head_dim, head_dim_v))
    if name == "cpu":
        is_fp8 = False
    key = (name, width, is_fp8)
    if causal and key in CAUSAL_CONFIGS:
        return CAUSAL_CONFIGS[key]
    return CONFIGS[key]


@triton.jit
def attention_fwd_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr,
    q_descale_ptr, k_descale_ptr, v_descale_ptr,
    cu_seqlens_q_ptr, cu_seqlens_k_ptr, block_table_ptr,
    kv_num_blocks_ptr, kv_indices_ptr, full_kv_num_blocks_ptr, full_kv_indices_ptr,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_ob, stride_os, stride_oh,
    stride_lse_b, stride_lse_h,
    stride_q_descale_b, stride_q_descale_h, stride_q_descale_t,
    stride_k_descale_b, stride_k_descale_h, stride_k_descale_t,
    stride_v_descale_b, stride_v_descale_h,
    stride_block_table_b,
    stride_mask_b, stride_mask_h, stride_mask_q, stride_index_b, stride_index_h, stride_index_q,
    stride_full_mask_b, stride_full_mask_h, stride_full_mask_q,
    stride_full_index_b, stride_full_index_h, stride_full_index_q,
    seqlen_q, seqlen_k, total_q, total_k, num_q_heads, gqa_group_size, num_pages,
    window_left, window_right, softmax_scale_log2, mod_args,
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    HAS_DESCALE: tl.constexpr, Q_DESCALE_BLOCK: tl.constexpr, K_DESCALE_BLOCK: tl.constexpr,
    RETURN_LSE: tl.constexpr, HEADS_PER_GROUP: tl.constexpr,
    IS_VARLEN: tl.constexpr, PAGE_SIZE: tl.constexpr,
    SCORE_MOD: tl.constexpr, MASK_MOD: tl.constexpr,
    BLOCK_MASK_Q: tl.constexpr, BLOCK_MASK_KV: tl.constexpr, HAS_FULL_BLOCKS: tl.constexpr,
    P_OFFSET: tl.constexpr, SCORE_LINEAR: tl.constexpr = False,
    V_ALIGNED: tl.constexpr = False,
):
    # Program order = launch order. Under a causal mask the last query tiles see the most keys,
    # so tiles go longest first (the short ones fill the tail) within groups of
    # HEADS_PER_GROUP (sequence, head) pairs, whose K/V the group's programs share in L2.
    # seqlen_q is the longest sequence's under IS_VARLEN (tiles past a sequence's end return).
    num_m_blocks = tl.cdiv(seqlen_q, BLOCK_M)
    pid = tl.program_id(0)
    tiles_per_group = HEADS_PER_GROUP * num_m_blocks
    group = pid // tiles_per_group
    num_batch_heads = tl.num_programs(0) // num_m_blocks
    heads_in_group = tl.minimum(HEADS_PER_GROUP, num_batch_heads - group * HEADS_PER_GROUP)
    within = pid - group * tiles_per_group
    start_m = num_m_blocks - 1 - within // heads_in_group
    batch_head = group * HEADS_PER_GROUP + within % heads_in_group
    batch = batch_head // num_q_heads
    head = batch_head % num_q_heads
    kv_head = head // gqa_group_size

    q_start = 0
    k_start = 0
    v_start = 0
    if IS_VARLEN:
        # Clamped to the tensors (total_q rows; total_k rows, or the block table's reach when
        # paged), so that inconsistent cu_seqlens never move a load or store outside them.
        q_start = tl.minimum(tl.load(cu_seqlens_q_ptr + batch), total_q)
        seqlen_q = tl.maximum(tl.minimum(tl.load(cu_seqlens_q_ptr + batch + 1), total_q)
                              - q_start, 0)
        k_first = tl.load(cu_seqlens_k_ptr + batch)
        k_end = tl.load(cu_seqlens_k_ptr + batch + 1)
        if PAGE_SIZE > 0:
            seqlen_k = tl.minimum(tl.maximum(k_end - k_first, 0), total_k)
        else:
            k_first = tl.minimum(k_first, total_k)
            seqlen_k = tl.maximum(tl.minimum(k_end, total_k) - k_first, 0)
            k_start = k_first.to(tl.int64)
            v_start = k_start
            if V_ALIGNED:
                v_start = tl.multiple_of(packed_v_start(k_first, batch), V_ALIGN).to(tl.int64)
        if start_m * BLOCK_M >= seqlen_q:
            return

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    offs_dv = tl.arange(0, HEAD_DIM_V_PAD)
    row_ok = offs_m < seqlen_q

    q_ptrs = (q_ptr + batch.to(tl.int64) * stride_qb + head.to(tl.int64) * stride_qh
              + (q_start + offs_m)[:, None].to(tl.int64) * stride_qs + offs_d[None, :])
    k_base = k_ptr + kv_head.to(tl.int64) * stride_kh
    v_base = v_ptr + kv_head.to(tl.int64) * stride_vh
    block_table_row = block_table_ptr
    if PAGE_SIZE > 0:
        block_table_row = block_table_ptr + batch.to(tl.int64) * stride_block_table_b
    else:
        k_base += batch.to(tl.int64) * stride_kb + k_start * stride_ks
        v_base += batch.to(tl.int64) * stride_vb + v_start * stride_vs
    q = load_tile(q_ptrs, row_ok, offs_d < HEAD_DIM, True, HEAD_DIM != HEAD_DIM_PAD)

    qk_scale = softmax_scale_log2
    v_scale = 1.0
    k_descale_row = k_descale_ptr
    if HAS_DESCALE:
        k_descale_row += batch * stride_k_descale_b + kv_head * stride_k_descale_h
        q_descale_at = q_descale_ptr + batch * stride_q_descale_b + head * stride_q_descale_h
        if Q_DESCALE_BLOCK > 0:
            # A block descale has one value per tile: BLOCK_M divides Q_DESCALE_BLOCK.
            q_descale_at += (start_m * BLOCK_M // Q_DESCALE_BLOCK) * stride_q_descale_t
        qk_scale *= tl.load(q_descale_at)
        if K_DESCALE_BLOCK == 0:
            qk_scale *= tl.load(k_descale_row)
        v_scale = tl.load(v_descale_ptr + batch * stride_v_descale_b + kv_head * stride_v_descale_h)

    # Query i sits at key position i + shift (bottom-right aligned when seqlen_q != seqlen_k).
    shift = seqlen_k - seqlen_q
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_V_PAD], dtype=tl.float32)
    bad_page = seqlen_k < 0
    if BLOCK_MASK_Q > 0:
        q_block = start_m * BLOCK_M // BLOCK_MASK_Q
        count_at = batch * stride_mask_b + head * stride_mask_h + q_block * stride_mask_q
        index_at = (batch.to(tl.int64) * stride_index_b + head.to(tl.int64) * stride_index_h
                    + q_block.to(tl.int64) * stride_index_q)
        acc, l_i, m_i, bad_page = attend_block_list(
            acc, l_i, m_i, bad_page, q, kv_num_blocks_ptr + count_at, kv_indices_ptr + index_at,
            k_base, v_base, stride_ks, stride_vs, stride_vd, block_table_row, num_pages, stride_kb,
            stride_vb, batch, head, offs_m, offs_n, offs_d, offs_dv, seqlen_k, shift, qk_scale,
            k_descale_row, stride_k_descale_t, mod_args, HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD,
            HEAD_DIM_V_PAD, BLOCK_N, PAGE_SIZE, SCORE_MOD, MASK_MOD, K_DESCALE_BLOCK, P_OFFSET,
            BLOCK_MASK_KV, SCORE_LINEAR=SCORE_LINEAR)
        if HAS_FULL_BLOCKS:
            full_count_at = (batch * stride_full_mask_b + head * stride_full_mask_h
                             + q_block * stride_full_mask_q)
            full_index_at = (batch.to(tl.int64) * stride_full_index_b
                             + head.to(tl.int64) * stride_full_index_h
                             + q_block.to(tl.int64) * stride_full_index_q)
            acc, l_i, m_i, bad_page = attend_block_list(
                acc, l_i, m_i, bad_page, q, full_kv_num_blocks_ptr + full_count_at,
                full_kv_indices_ptr + full_index_at, k_base, v_base, stride_ks, stride_vs,
                stride_vd, block_table_row, num_pages, stride_kb, stride_vb, batch, head, offs_m,
                offs_n, offs_d, offs_dv, seqlen_k, shift, qk_scale, k_descale_row,
                stride_k_descale_t, mod_args, HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD, HEAD_DIM_V_PAD,
                BLOCK_N, PAGE_SIZE, SCORE_MOD, None, K_DESCALE_BLOCK, P_OFFSET, BLOCK_MASK_KV,
                SCORE_LINEAR=SCORE_LINEAR)
    else:
        last_row = tl.minimum(start_m * BLOCK_M + BLOCK_M, seqlen_q)
        lo, full_lo, full_hi, hi = key_blocks(start_m * BLOCK_M, last_row, seqlen_k, shift,
                                              window_left, window_right, HAS_LEFT, HAS_RIGHT,
                                              BLOCK_N)
        if HAS_LEFT:
            acc, l_i, m_i, bad_page = attend_key_blocks(
                acc, l_i, m_i, bad_page, q, lo, full_lo, None, k_base, v_base, stride_ks, stride_vs,
                stride_vd, block_table_row, num_pages, stride_kb, stride_vb, batch, head, offs_m,
                offs_n, offs_d, offs_dv, seqlen_k, shift, window_left, window_right, qk_scale,
                k_descale_row, stride_k_descale_t, mod_args, HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD,
                HEAD_DIM_V_PAD, BLOCK_N, True, HAS_LEFT, HAS_RIGHT, PAGE_SIZE, SCORE_MOD, None,
                K_DESCALE_BLOCK, P_OFFSET, SCORE_LINEAR=SCORE_LINEAR)
        acc, l_i, m_i, bad_page = attend_key_blocks(
            acc, l_i, m_i, bad_page, q, full_lo, full_hi, None, k_base, v_base, stride_ks,
            stride_vs, stride_vd, block_table_row, num_pages, stride_kb, stride_vb, batch, head,
            offs_m, offs_n, offs_d, offs_dv, seqlen_k, shift, window_left, window_right, qk_scale,
            k_descale_row, stride_k_descale_t, mod_args, HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD,
            HEAD_DIM_V_PAD, BLOCK_N, False, HAS_LEFT, HAS_RIGHT, PAGE_SIZE, SCORE_MOD, None,
            K_DESCALE_BLOCK, P_OFFSET, SCORE_LINEAR=SCORE_LINEAR)
        acc, l_i, m_i, bad_page = attend_key_blocks(
            acc, l_i, m_i, bad_page, q, full_hi, hi, None, k_base, v_base, stride_ks, stride_vs,
            stride_vd, block_table_row, num_pages, stride_kb, stride_vb, batch, head, offs_m,
            offs_n, offs_d, offs_dv, seqlen_k, shift, window_left, window_right, qk_scale,
            k_descale_row, stride_k_descale_t, mod_args, HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD,
            HEAD_DIM_V_PAD, BLOCK_N, True, HAS_LEFT, HAS_RIGHT, PAGE_SIZE, SCORE_MOD, None,
            K_DESCALE_BLOCK, P_OFFSET, SCORE_LINEAR=SCORE_LINEAR)

    # Rows that see no key at all output 0, lse -inf. A page id outside the cache (never
    # followed) turns the tile into NaN: the host checks ids outside CUDA graph capture.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    row_scale = v_scale / l_safe
    if PAGE_SIZE > 0:
        row_scale = tl.where(bad_page, float("nan"), row_scale)
    acc = acc * row_scale[:, None]
    out_ptrs = (out_ptr + batch.to(tl.int64) * stride_ob + head.to(tl.int64) * stride_oh
                + (q_start + offs_m)[:, None].to(tl.int64) * stride_os + offs_dv[None, :])
    out_mask = row_ok[:, None]
    if HEAD_DIM_V != HEAD_DIM_V_PAD:
        out_mask = out_mask & (offs_dv[None, :] < HEAD_DIM_V)
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
    if RETURN_LSE:
        lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(l_safe) - P_OFFSET) * _LN_2)
        if PAGE_SIZE > 0:
            lse = tl.where(bad_page, float("nan"), lse)
        lse_ptrs = (lse_ptr + batch.to(tl.int64) * stride_lse_b + head.to(tl.int64) * stride_lse_h
                    + q_start + offs_m)
        tl.store(lse_ptrs, lse, mask=row_ok)


def _block_list_strides(block_mask) -> dict:
    """Kernel stride arguments of a block mask's count ([B, H, q_blocks]) and index
    ([B, H, q_blocks, n]) tensors, partial and full; zeros without one."""
    names = ("b", "h", "q")
    strides = {}
    for prefix, counts, indices in (
            ("", "kv_num_blocks", "kv_indices"), ("full_", "full_kv_num_blocks", "full_kv_indices")):
        count = getattr(block_mask, counts, None) if block_mask else None
        index = getattr(block_mask, indices, None) if block_mask else None
        if index is not None and index.shape[-1] > 0 and index.stride(-1) != 1:
            raise ValueError(f"{indices} must have a contiguous last dim, got {index.stride()}")
        for i, name in enumerate(names):
            strides[f"stride_{prefix}mask_{name}"] = count.stride(i) if count is not None else 0
            strides[f"stride_{prefix}index_{name}"] = index.stride(i) if index is not None else 0
    return strides


@dataclass(frozen=True)
class Masks:
    """Which keys each query sees, beyond the sequence bounds (all optional):
    causal and window_left/right as in masks.py (-1: unbounded), score_mod / mask_mod hooks
    with their mod_args tuple (docs/design.md, "Mods"), and a block mask
    (flex.block_mask.BlockMaskTensors: partial and full block lists and their block sizes).
    score_linear: score_mod has flex/linear.py's form (the kernel adds it as a term per key
    column and one per row; the built-in ALiBi under causal is added so too)."""
    causal: bool = False
    window_left: int = -1
    window_right: int = -1
    score_mod: object = None
    mask_mod: object = None
    mod_args: tuple = ()
    block_mask: object = None
    score_linear: bool = False


NO_MASKS = Masks()


@dataclass(frozen=True)
class Sequences:
    """How sequences are laid out: None fields mean the dense [batch, seqlen, heads, dim]
    layout. cu_seqlens_q/k int32 [B + 1] (packed rows), max_seqlen_q (the grid's reach),
    block_table int32 [B, max_pages] for paged K/V."""
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    block_table: torch.Tensor | None = None
    # V is fp8.packed_k_major_copy's: sequence b's keys start at layout.packed_v_start(b).
    v_aligned_starts: bool = False


DENSE = Sequences()


def attention_launch(q, k, v, out, lse, q_descale, k_descale, v_descale,
                     softmax_scale: float, causal: bool, arch: Arch,
                     config: TileConfig | None = None, *, masks: Masks | None = None,
                     sequences: Sequences = DENSE) -> KernelLaunch:
    """The kernel launch for checked inputs; `.run()` writes `out` (and `lse` if given).
    causal is masks.causal (kept positional for the dense callers); config overrides the
    table's row (tests, tuning)."""
    masks = masks or (Masks(causal=True) if causal else NO_MASKS)
    varlen = sequences.cu_seqlens_q is not None
    paged = sequences.block_table is not None
    num_q_heads, head_dim = q.shape[-2], q.shape[-1]
    num_kv_heads, head_dim_v = k.shape[-2], v.shape[-1]
    is_fp8 = q_descale is not None
    config = config or config_for(arch, head_dim, head_dim_v, is_fp8, masks.causal)
    if varlen:
        batch = sequences.cu_seqlens_q.shape[0] - 1
        seqlen_q, seqlen_k = sequences.max_seqlen_q, sequences.max_seqlen_k
        q_strides = (0, q.stride(0), q.stride(1))
        out_strides = (0, out.stride(0), out.stride(1))
        lse_strides = (0, lse.stride(0)) if lse is not None else (0, 0)
    else:
        batch, seqlen_q = q.shape[0], q.shape[1]
        seqlen_k = k.shape[1]
        q_strides = (q.stride(0), q.stride(1), q.stride(2))
        out_strides = (out.stride(0), out.stride(1), out.stride(2))
        lse_strides = (lse.stride(0), lse.stride(1)) if lse is not None else (0, 0)
    if paged or not varlen:
        k_strides = (k.stride(0), k.stride(1), k.stride(2))
        v_strides = (v.stride(0), v.stride(1), v.stride(2), v.stride(3))
    else:
        k_strides = (0, k.stride(0), k.stride(1))
        v_strides = (0, v.stride(0), v.stride(1), v.stride(2))
    block_mask = masks.block_mask
    q_descale, sqb, sqh = descale_args(q_descale)
    k_descale, skb, skh = descale_args(k_descale)
    v_descale, svb, svh = descale_args(v_descale)
    args = dict(
        q_ptr=q, k_ptr=k, v_ptr=v, out_ptr=out, lse_ptr=lse,
        q_descale_ptr=q_descale, k_descale_ptr=k_descale, v_descale_ptr=v_descale,
        cu_seqlens_q_ptr=sequences.cu_seqlens_q, cu_seqlens_k_ptr=sequences.cu_seqlens_k,
        block_table_ptr=sequences.block_table,
        kv_num_blocks_ptr=block_mask.kv_num_blocks if block_mask else None,
        kv_indices_ptr=block_mask.kv_indices if block_mask else None,
        full_kv_num_blocks_ptr=block_mask.full_kv_num_blocks if block_mask else None,
        full_kv_indices_ptr=block_mask.full_kv_indices if block_mask else None,
        stride_qb=q_strides[0], stride_qs=q_strides[1], stride_qh=q_strides[2],
        stride_kb=k_strides[0], stride_ks=k_strides[1], stride_kh=k_strides[2],
        stride_vb=v_strides[0], stride_vs=v_strides[1], stride_vh=v_strides[2],
        stride_vd=v_strides[3],
        stride_ob=out_strides[0], stride_os=out_strides[1], stride_oh=out_strides[2],
        stride_lse_b=lse_strides[0], stride_lse_h=lse_strides[1],
        stride_q_descale_b=sqb, stride_q_descale_h=sqh,
        stride_q_descale_t=block_descale_stride(q_descale),
        stride_k_descale_b=skb, stride_k_descale_h=skh,
        stride_k_descale_t=block_descale_stride(k_descale),
        stride_v_descale_b=svb, stride_v_descale_h=svh,
        stride_block_table_b=sequences.block_table.stride(0) if paged else 0,
        **_block_list_strides(block_mask),
        seqlen_q=seqlen_q, seqlen_k=seqlen_k,
        total_q=q.shape[0] if varlen else 0,
        total_k=(sequences.block_table.shape[1] * k.shape[1] if paged else k.shape[0])
        if varlen else 0,
        num_q_heads=num_q_heads,
        gqa_group_size=num_q_heads // num_kv_heads,
        num_pages=k.shape[0] if paged else 0,
        window_left=max(masks.window_left, 0),
        window_right=0 if masks.causal else max(masks.window_right, 0),
        softmax_scale_log2=softmax_scale * LOG2_E,
        mod_args=tuple(masks.mod_args),
    )
    constexprs = dict(
        HEAD_DIM=head_dim, HEAD_DIM_V=head_dim_v,
        HEAD_DIM_PAD=padded_head_dim(head_dim), HEAD_DIM_V_PAD=padded_head_dim(head_dim_v),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        CAUSAL=masks.causal, HAS_LEFT=masks.window_left >= 0,
        HAS_RIGHT=masks.causal or masks.window_right >= 0,
        HAS_DESCALE=is_fp8, RETURN_LSE=lse is not None,
        Q_DESCALE_BLOCK=_block_rows(q_descale, config.block_m),
        K_DESCALE_BLOCK=_block_rows(k_descale, config.block_n),
        HEADS_PER_GROUP=heads_per_group(masks.causal, seqlen_k, head_dim + head_dim_v,
                                        q.element_size()),
        IS_VARLEN=varlen, PAGE_SIZE=k.shape[1] if paged else 0,
        SCORE_MOD=masks.score_mod, MASK_MOD=masks.mask_mod,
        BLOCK_MASK_Q=block_mask.q_block_size if block_mask else 0,
        BLOCK_MASK_KV=block_mask.kv_block_size if block_mask else 0,
        HAS_FULL_BLOCKS=block_mask is not None and block_mask.full_kv_num_blocks is not None,
        P_OFFSET=FP8_P_OFFSET if is_fp8 else 0.0,
        SCORE_LINEAR=mods.is_linear(masks.score_mod, masks.causal, masks.score_linear),
        V_ALIGNED=sequences.v_aligned_starts,
    )
    grid = (-(-seqlen_q // config.block_m) * batch * num_q_heads,)
    return KernelLaunch(attention_fwd_kernel, grid, args, constexprs,
                        config.num_warps, config.num_stages)


def _block_rows(descale: torch.Tensor | None, tile: int) -> int:
    """DESCALE_BLOCK_ROWS for a block descale (whose entries the tile must not straddle), else 0."""
    if descale is None or descale.dim() != 3:
        return 0
    if DESCALE_BLOCK_ROWS % tile:
        raise ValueError(f"a {tile}-row tile straddles {DESCALE_BLOCK_ROWS}-row descale blocks")
    return DESCALE_BLOCK_ROWS


def bind_attention(launch: KernelLaunch):
    """attention_launch's launch as a function of its tensors and softmax scale, for later calls
    with inputs of the same shapes, strides, dtypes and alignment (the call caches,
    ops/call_cache.py); a packed or paged launch's also takes the call's cu_seqlens_q,
    cu_seqlens_k and block_table. None where the launch cannot be bound (KernelLaunch.bind)."""
    bound = launch.bind()
    if bound is None:
        return None

    def run(q, k, v, out, lse, q_descale, k_descale, v_descale, softmax_scale: float,
            mod_args: tuple = (), cu_seqlens_q=None, cu_seqlens_k=None,
            block_table=None) -> None:
        bound.run(q_ptr=q, k_ptr=k, v_ptr=v, out_ptr=out, lse_ptr=lse, q_descale_ptr=q_descale,
                  k_descale_ptr=k_descale, v_descale_ptr=v_descale,
                  cu_seqlens_q_ptr=cu_seqlens_q, cu_seqlens_k_ptr=cu_seqlens_k,
                  block_table_ptr=block_table, softmax_scale_log2=softmax_scale * LOG2_E,
                  mod_args=mod_args)
    return run
