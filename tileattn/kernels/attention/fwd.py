"""Portable Triton forward attention (FP16/BF16/FP8) for sm80 and newer, and the interpreter.

One program computes one BLOCK_M tile of queries for one (batch, query head). It walks the keys
in two loops: first the key blocks every query of the tile may see in full (no masking work),
then the blocks that cross the sequence end or the causal diagonal (masked). Softmax is online
in base 2 with fp32 statistics; FP8 descales are folded into the softmax scale (q, k) and into
the final normalisation (v), so the inner loop does no extra multiplies.

Pointer layouts (element strides; every tensor may come from a larger fused buffer):
    q    [batch, seqlen_q, num_q_heads, head_dim]     last dim contiguous
    k    [batch, seqlen_k, num_kv_heads, head_dim]    last dim contiguous
    v    [batch, seqlen_k, num_kv_heads, head_dim_v]  last dim contiguous (row-major) or
                                                      seqlen dim contiguous (K-major)
    out  [batch, seqlen_q, num_q_heads, head_dim_v]   last dim contiguous
    lse  [batch, num_q_heads, seqlen_q] float32        natural log, contiguous
    *_descale float32 [batch, heads] with strides, or a scalar read through strides 0
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...arch import Arch
from ...scheduler import heads_per_group
from ..runtime import KernelLaunch
from ..softmax import online_softmax_step


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


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
# Chips whose rows are another chip's: same shared memory and MMA generation.
_SAME_CONFIGS_AS = {"sm86": "sm89", "sm120": "sm89", "sm87": "sm80", "sm100": "sm90",
                    "rocm": "sm80"}


def padded_head_dim(head_dim: int) -> int:
    """Triton tiles are powers of two: 96 runs as 128 and 192 as 256 (padding is masked)."""
    # Plain bit arithmetic: triton.next_power_of_2 is a JIT-wrapped helper whose host cost
    # short-context calls cannot afford (docs/design.md, "Host overhead and the call cache").
    return max(16, 1 << (head_dim - 1).bit_length())


def config_for(arch: Arch, head_dim: int, head_dim_v: int, is_fp8: bool,
               causal: bool = False) -> TileConfig:
    name = _SAME_CONFIGS_AS.get(arch.name, arch.name)
    width = padded_head_dim(max(head_dim, head_dim_v))
    if name == "cpu":
        is_fp8 = False
    key = (name, width, is_fp8)
    if causal and key in CAUSAL_CONFIGS:
        return CAUSAL_CONFIGS[key]
    return CONFIGS[key]


@triton.jit
def _load_tile(ptrs, rows, num_rows, cols, num_cols, MASK_ROWS: tl.constexpr, MASK_COLS: tl.constexpr):
    """Load a 2-D tile, zero-filling rows >= num_rows and cols >= num_cols where asked.

    Unmasked loads where the bounds are known to hold keep the steady-state loop predicate-free.
    """
    if MASK_ROWS and MASK_COLS:
        return tl.load(ptrs, mask=(rows[:, None] < num_rows) & (cols[None, :] < num_cols), other=0.0)
    elif MASK_ROWS:
        return tl.load(ptrs, mask=rows[:, None] < num_rows, other=0.0)
    elif MASK_COLS:
        return tl.load(ptrs, mask=cols[None, :] < num_cols, other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def _attend_key_blocks(
    acc, l_i, m_i, q,
    k_ptrs, v_ptrs, stride_ks, stride_vs,
    offs_m, offs_n, offs_d, offs_dv,
    key_start, key_end, seqlen_k, causal_shift, qk_scale,
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
):
    """Online-softmax update of (acc, l_i, m_i) over keys [key_start, key_end). Rows of K and V
    at or past seqlen_k load as zeros."""
    k_ptrs += key_start * stride_ks
    v_ptrs += key_start * stride_vs
    for start_n in tl.range(key_start, key_end, BLOCK_N):
        cols = start_n + offs_n
        k = _load_tile(k_ptrs, cols, seqlen_k, offs_d, HEAD_DIM, MASKED, HEAD_DIM != HEAD_DIM_PAD)
        qk = tl.dot(q, tl.trans(k))
        if MASKED:
            visible = cols[None, :] < seqlen_k
            if CAUSAL:
                visible = visible & (cols[None, :] <= offs_m[:, None] + causal_shift)
            qk = tl.where(visible, qk, float("-inf"))
        p, acc, l_i, m_new = online_softmax_step(qk, m_i, l_i, acc, qk_scale, MASKED)
        v = _load_tile(v_ptrs, cols, seqlen_k, offs_dv, HEAD_DIM_V, MASKED,
                       HEAD_DIM_V != HEAD_DIM_V_PAD)
        # FP8: P in [0, 1] is rounded to e4m3 even when V is e5m2; e4m3's extra mantissa bit
        # halves the rounding error of P and the tensor cores take mixed FP8 operands.
        p = p.to(tl.float8e4nv) if v.dtype == tl.float8e5 else p.to(v.dtype)
        acc = tl.dot(p, v, acc)
        m_i = m_new
        k_ptrs += BLOCK_N * stride_ks
        v_ptrs += BLOCK_N * stride_vs
    return acc, l_i, m_i


@triton.jit
def attention_fwd_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr,
    q_descale_ptr, k_descale_ptr, v_descale_ptr,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_ob, stride_os, stride_oh,
    stride_q_descale_b, stride_q_descale_h,
    stride_k_descale_b, stride_k_descale_h,
    stride_v_descale_b, stride_v_descale_h,
    seqlen_q, seqlen_k, num_q_heads, gqa_group_size,
    softmax_scale_log2,
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_DESCALE: tl.constexpr, RETURN_LSE: tl.constexpr,
    HEADS_PER_GROUP: tl.constexpr,
):
    num_m_blocks = tl.cdiv(seqlen_q, BLOCK_M)
    # Program order = launch order. Under a causal mask the last query tiles see the most keys,
    # so tiles go longest first (the short ones fill the tail) within groups of
    # HEADS_PER_GROUP (batch, head) pairs, whose K/V the group's programs share in L2.
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

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    offs_dv = tl.arange(0, HEAD_DIM_V_PAD)

    q_base = q_ptr + batch.to(tl.int64) * stride_qb + head.to(tl.int64) * stride_qh
    k_base = k_ptr + batch.to(tl.int64) * stride_kb + kv_head.to(tl.int64) * stride_kh
    v_base = v_ptr + batch.to(tl.int64) * stride_vb + kv_head.to(tl.int64) * stride_vh
    q_ptrs = q_base + offs_m[:, None].to(tl.int64) * stride_qs + offs_d[None, :]
    k_ptrs = k_base + offs_n[:, None].to(tl.int64) * stride_ks + offs_d[None, :]
    v_ptrs = v_base + offs_n[:, None].to(tl.int64) * stride_vs + offs_dv[None, :] * stride_vd

    q = _load_tile(q_ptrs, offs_m, seqlen_q, offs_d, HEAD_DIM, True, HEAD_DIM != HEAD_DIM_PAD)

    qk_scale = softmax_scale_log2
    v_scale = 1.0
    if HAS_DESCALE:
        qk_scale *= tl.load(q_descale_ptr + batch * stride_q_descale_b + head * stride_q_descale_h)
        qk_scale *= tl.load(k_descale_ptr + batch * stride_k_descale_b + kv_head * stride_k_descale_h)
        v_scale = tl.load(v_descale_ptr + batch * stride_v_descale_b + kv_head * stride_v_descale_h)

    # Query i sees keys j <= i + causal_shift (bottom-right aligned when seqlen_q != seqlen_k).
    causal_shift = seqlen_k - seqlen_q
    if CAUSAL:
        key_end = tl.minimum(seqlen_k, (start_m + 1) * BLOCK_M + causal_shift)
        key_end = tl.maximum(key_end, 0)
        first_row_sees = tl.minimum(start_m * BLOCK_M + causal_shift + 1, seqlen_k)
        full_end = tl.maximum(first_row_sees, 0) // BLOCK_N * BLOCK_N
    else:
        key_end = seqlen_k
        full_end = seqlen_k // BLOCK_N * BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_V_PAD], dtype=tl.float32)
    acc, l_i, m_i = _attend_key_blocks(
        acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_ks, stride_vs,
        offs_m, offs_n, offs_d, offs_dv, 0, full_end, seqlen_k, causal_shift, qk_scale,
        HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD, HEAD_DIM_V_PAD, BLOCK_M, BLOCK_N, False, CAUSAL)
    acc, l_i, m_i = _attend_key_blocks(
        acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_ks, stride_vs,
        offs_m, offs_n, offs_d, offs_dv, full_end, key_end, seqlen_k, causal_shift,
        qk_scale, HEAD_DIM, HEAD_DIM_V, HEAD_DIM_PAD, HEAD_DIM_V_PAD, BLOCK_M, BLOCK_N, True,
        CAUSAL)

    # Rows that see no key at all (seqlen_q > seqlen_k under causal) output 0, lse -inf.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    acc = acc * (v_scale / l_safe)[:, None]
    out_ptrs = (out_ptr + batch.to(tl.int64) * stride_ob + head.to(tl.int64) * stride_oh
                + offs_m[:, None].to(tl.int64) * stride_os + offs_dv[None, :])
    out_mask = offs_m[:, None] < seqlen_q
    if HEAD_DIM_V != HEAD_DIM_V_PAD:
        out_mask = out_mask & (offs_dv[None, :] < HEAD_DIM_V)
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
    if RETURN_LSE:
        lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
        lse_ptrs = lse_ptr + batch_head.to(tl.int64) * seqlen_q + offs_m
        tl.store(lse_ptrs, lse, mask=offs_m < seqlen_q)


LOG2_E = 1.4426950408889634


def _descale_args(descale: torch.Tensor | None) -> tuple[torch.Tensor | None, int, int]:
    if descale is None or descale.dim() == 0:
        return descale, 0, 0
    return descale, descale.stride(0), descale.stride(1)


def attention_launch(q, k, v, out, lse, q_descale, k_descale, v_descale,
                     softmax_scale: float, causal: bool, arch: Arch,
                     config: TileConfig | None = None) -> KernelLaunch:
    """The kernel launch for checked inputs; `.run()` writes `out` (and `lse` if given).
    config overrides the table's row (tests, tuning)."""
    batch, seqlen_q, num_q_heads, head_dim = q.shape
    seqlen_k, num_kv_heads, head_dim_v = k.shape[1], k.shape[2], v.shape[3]
    is_fp8 = q_descale is not None
    config = config or config_for(arch, head_dim, head_dim_v, is_fp8, causal)
    q_descale, sqb, sqh = _descale_args(q_descale)
    k_descale, skb, skh = _descale_args(k_descale)
    v_descale, svb, svh = _descale_args(v_descale)
    args = dict(
        q_ptr=q, k_ptr=k, v_ptr=v, out_ptr=out, lse_ptr=lse,
        q_descale_ptr=q_descale, k_descale_ptr=k_descale, v_descale_ptr=v_descale,
        stride_qb=q.stride(0), stride_qs=q.stride(1), stride_qh=q.stride(2),
        stride_kb=k.stride(0), stride_ks=k.stride(1), stride_kh=k.stride(2),
        stride_vb=v.stride(0), stride_vs=v.stride(1), stride_vh=v.stride(2), stride_vd=v.stride(3),
        stride_ob=out.stride(0), stride_os=out.stride(1), stride_oh=out.stride(2),
        stride_q_descale_b=sqb, stride_q_descale_h=sqh,
        stride_k_descale_b=skb, stride_k_descale_h=skh,
        stride_v_descale_b=svb, stride_v_descale_h=svh,
        seqlen_q=seqlen_q, seqlen_k=seqlen_k, num_q_heads=num_q_heads,
        gqa_group_size=num_q_heads // num_kv_heads,
        softmax_scale_log2=softmax_scale * LOG2_E,
    )
    constexprs = dict(
        HEAD_DIM=head_dim, HEAD_DIM_V=head_dim_v,
        HEAD_DIM_PAD=padded_head_dim(head_dim), HEAD_DIM_V_PAD=padded_head_dim(head_dim_v),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        CAUSAL=causal, HAS_DESCALE=is_fp8, RETURN_LSE=lse is not None,
        HEADS_PER_GROUP=heads_per_group(causal, seqlen_k, head_dim + head_dim_v, q.element_size()),
    )
    grid = (-(-seqlen_q // config.block_m) * batch * num_q_heads,)
    return KernelLaunch(attention_fwd_kernel, grid, args, constexprs,
                        config.num_warps, config.num_stages)


def bind_attention(launch: KernelLaunch):
    """attention_launch's launch as a function of its tensors and softmax scale, for later calls
    with inputs of the same shapes, strides, dtypes and alignment (the call cache (ops/call_cache.py)); None
    where the launch cannot be bound (see KernelLaunch.bind)."""
    bound = launch.bind()
    if bound is None:
        return None

    def run(q, k, v, out, lse, q_descale, k_descale, v_descale, softmax_scale: float) -> None:
        bound.run(q_ptr=q, k_ptr=k, v_ptr=v, out_ptr=out, lse_ptr=lse, q_descale_ptr=q_descale,
                  k_descale_ptr=k_descale, v_descale_ptr=v_descale,
                  softmax_scale_log2=softmax_scale * LOG2_E)
    return run
