"""The attention backward pass: config tables, the two row kernels around the main ones, and
the launcher that writes dq, dk, dv.

Launch order:
  1. attention_bwd_preprocess_kernel: delta = rowsum(dO ∘ O) in fp32 (and, for the default
     atomic dQ, zeroes the fp32 dQ buffer, so no separate memset runs);
  2. attention_bwd_dkdv_kernel (attention_bwd_dkdv.py): dK and dV, deterministically, and by
     default dQ too, by fp32 atomics (one recomputation of P for all three gradients);
  3. either attention_bwd_dq_convert_kernel: dq = softmax_scale · dQ buffer, in dq's dtype and
     strides; or, deterministic=True, attention_bwd_dq_kernel (attention_bwd_dq.py): dQ in a
     second pass over the keys with a fixed order of additions.

On Hopper (kernel="sm90") dense calls without windows or hooks run steps 2 and 3 as the
Gluon kernels of sm90_bwd.py where their tables have a row for the head dims; with the atomic
dQ, step 2 is sm90_bwd_fused.py's warp-specialized kernel (dQ by TMA reductions) where it
supports the inputs; dense calls without a mask run it as two launches, key block 0 storing
its dQ tiles, then the other blocks adding to them, and step 1 zeroes no dQ row
(sm90_bwd_fused.first_block_stores).

With a block mask (flex_attention's BlockMask, as flex.block_mask.BlockMaskTensors with its
transposed lists) the dQ kernel walks each query block's listed key blocks and the dK/dV
kernel each key block's listed query blocks; the tiles must divide the mask's blocks.

Pointer layouts as in attention_bwd_dkdv.py. Workspace (attention_backward allocates it,
backward_launches takes it): delta float32 with lse's shape, contiguous; dq_accum float32
[batch, seqlen_q, num_q_heads, head_dim] (varlen [total_q, num_q_heads, head_dim]),
contiguous, only for the atomic dQ.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...arch import Arch
from . import sm90_bwd, sm90_bwd_fused
from .bwd_dkdv import attention_bwd_dkdv_kernel
from .bwd_dq import attention_bwd_dq_kernel
from .bwd_scores import packed_rows
from .configs import SAME_CONFIGS_AS, TileConfig, padded_head_dim
from ..runtime import KernelLaunch

# (arch, padded max(head_dim, head_dim_v)) -> tile configs; every row must fit the chip's
# shared memory (tests/test_attention_bwd_cross_compile.py compiles each row for its chip).
# sm90 rows: the fastest whole backward (dK/dV and dQ pairs timed together) of an H100 sweep,
# bf16, N 4096 and 16384, causal and not (`python benchmarks/backward.py --sweep`;
# docs/design.md, "Backward"). The other chips' rows are not measured on a GPU: the largest
# tiles ptxas compiles without spills (benchmarks/backward_registers.py).
#
# dK/dV: block_n keys per program, block_m queries per step. Each key block reads all of Q and
# dO once, so block_n divides that traffic; its fp32 dK, dV (2·block_n·head_dim values) stay in
# registers for the whole program, which caps it. On sm90 the larger wgmma tiles pay for some
# spilled registers (64 queries × 128 keys at D=128 beat the spill-free 16 × 128 by 1.4×).
DKDV_CONFIGS: dict[tuple[str, int], TileConfig] = {
    ("sm90", 64): TileConfig(32, 128, 4, 3),
    ("sm90", 128): TileConfig(64, 128, 8, 2),
    ("sm90", 256): TileConfig(64, 64, 8, 2),
    ("sm80", 64): TileConfig(16, 128, 8, 2),
    ("sm80", 128): TileConfig(16, 128, 8, 2),
    ("sm80", 256): TileConfig(32, 32, 8, 2),
    # sm86 / sm89 / sm120: 99 KB.
    ("sm89", 64): TileConfig(32, 128, 8, 2),
    ("sm89", 128): TileConfig(16, 128, 8, 2),
    ("sm89", 256): TileConfig(32, 32, 8, 2),
    # The interpreter: small tiles so that short test sequences span several blocks.
    ("cpu", 64): TileConfig(16, 16, 4, 1),
    ("cpu", 128): TileConfig(16, 16, 4, 1),
    ("cpu", 256): TileConfig(16, 16, 4, 1),
}
# The atomic-dQ dK/dV kernel (deterministic=False, kept for the benchmark) also stages its dQ
# product's operands: where a row does not fit with them it takes one stage fewer (the fastest
# atomic row of the same sweep at D=256).
ATOMIC_DKDV_CONFIGS: dict[tuple[str, int], TileConfig] = {
    ("sm90", 256): TileConfig(64, 64, 8, 1),
}
# Deterministic dQ: block_m queries per program (Q, dO and the fp32 dQ stay in registers),
# block_n keys per step. The largest block_m that does not spill (each query block reads all
# of K and V once), then block_n, with two stages where they fit.
DQ_CONFIGS: dict[tuple[str, int], TileConfig] = {
    ("sm90", 64): TileConfig(128, 64, 8, 2),
    ("sm90", 128): TileConfig(128, 64, 8, 3),
    ("sm90", 256): TileConfig(128, 32, 8, 2),
    ("sm80", 64): TileConfig(128, 64, 8, 2),
    ("sm80", 128): TileConfig(128, 32, 8, 2),
    ("sm80", 256): TileConfig(64, 32, 8, 2),
    ("sm89", 64): TileConfig(128, 64, 8, 2),
    ("sm89", 128): TileConfig(128, 32, 8, 2),
    ("sm89", 256): TileConfig(64, 16, 8, 2),
    ("cpu", 64): TileConfig(16, 16, 4, 1),
    ("cpu", 128): TileConfig(16, 16, 4, 1),
    ("cpu", 256): TileConfig(16, 16, 4, 1),
}
# The row kernels (preprocess, dQ conversion) stream one tile of rows each; memory-bound.
ROWS_PER_PROGRAM = {"cpu": 16}
DEFAULT_ROWS_PER_PROGRAM = 64


def _key(arch: Arch, head_dim: int, head_dim_v: int) -> tuple[str, int]:
    return SAME_CONFIGS_AS.get(arch.name, arch.name), padded_head_dim(max(head_dim, head_dim_v))


def dkdv_config(arch: Arch, head_dim: int, head_dim_v: int, atomic_dq: bool = False) -> TileConfig:
    key = _key(arch, head_dim, head_dim_v)
    return ATOMIC_DKDV_CONFIGS.get(key, DKDV_CONFIGS[key]) if atomic_dq else DKDV_CONFIGS[key]


def dq_config(arch: Arch, head_dim: int, head_dim_v: int) -> TileConfig:
    return DQ_CONFIGS[_key(arch, head_dim, head_dim_v)]


@triton.jit
def attention_bwd_preprocess_kernel(
    out_ptr, do_ptr, dlse_ptr, delta_ptr, dq_accum_ptr, cu_seqlens_q,
    stride_ob, stride_os, stride_oh, stride_dob, stride_dos, stride_doh,
    stride_lse_b, stride_lse_h, stride_dq_accum_b, stride_dq_accum_s, stride_dq_accum_h,
    seqlen_q, zero_rows,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    HEAD_DIM_V: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, IS_VARLEN: tl.constexpr, ZERO_DQ_ACCUM: tl.constexpr,
    HAS_DLSE: tl.constexpr,
):
    """delta[row] = Σ_d dO[row, d] · O[row, d] - dlse[row] in fp32, per query row and head
    (delta and dlse laid out as lse, with its strides). dlse, the gradient reaching lse, joins
    here because d lse_i / d s_ij = P_ij: dS = P ∘ (dP - delta) then carries it. With
    ZERO_DQ_ACCUM also dq_accum's first zero_rows rows of each sequence = 0 (backward_launches
    asks for none where the fused kernel's key block 0 stores every row first). Grid (query
    blocks of the longest sequence, num_q_heads, batch)."""
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1)
    batch = tl.program_id(2)
    q_start, seqlen_q = packed_rows(batch, cu_seqlens_q, seqlen_q, IS_VARLEN)
    if start_m >= seqlen_q:
        return
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, HEAD_DIM_V_PAD)
    rows = (q_start + offs_m)[:, None].to(tl.int64)
    mask = (offs_m[:, None] < seqlen_q) & (offs_dv[None, :] < HEAD_DIM_V)
    out = tl.load(out_ptr + batch.to(tl.int64) * stride_ob + head.to(tl.int64) * stride_oh
                  + rows * stride_os + offs_dv[None, :], mask=mask, other=0.0)
    do = tl.load(do_ptr + batch.to(tl.int64) * stride_dob + head.to(tl.int64) * stride_doh
                 + rows * stride_dos + offs_dv[None, :], mask=mask, other=0.0)
    delta = tl.sum(out.to(tl.float32) * do.to(tl.float32), axis=1)
    lse_at = batch.to(tl.int64) * stride_lse_b + head.to(tl.int64) * stride_lse_h + q_start + offs_m
    if HAS_DLSE:
        delta -= tl.load(dlse_ptr + lse_at, mask=offs_m < seqlen_q, other=0.0)
    tl.store(delta_ptr + lse_at, delta, mask=offs_m < seqlen_q)
    if ZERO_DQ_ACCUM:
        zero_below = tl.minimum(zero_rows, seqlen_q)
        if start_m < zero_below:
            offs_d = tl.arange(0, HEAD_DIM_PAD)
            dq_ptrs = (dq_accum_ptr + batch.to(tl.int64) * stride_dq_accum_b
                       + head.to(tl.int64) * stride_dq_accum_h + rows * stride_dq_accum_s
                       + offs_d[None, :])
            tl.store(dq_ptrs, tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32),
                     mask=(offs_m[:, None] < zero_below) & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def attention_bwd_dq_convert_kernel(
    dq_accum_ptr, dq_ptr, cu_seqlens_q,
    stride_dq_accum_b, stride_dq_accum_s, stride_dq_accum_h, stride_dqb, stride_dqs, stride_dqh,
    seqlen_q, softmax_scale,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    """dq = softmax_scale · dq_accum, in dq's dtype and strides. Grid as the preprocess's."""
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1)
    batch = tl.program_id(2)
    q_start, seqlen_q = packed_rows(batch, cu_seqlens_q, seqlen_q, IS_VARLEN)
    if start_m >= seqlen_q:
        return
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    rows = (q_start + offs_m)[:, None].to(tl.int64)
    mask = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
    dq = tl.load(dq_accum_ptr + batch.to(tl.int64) * stride_dq_accum_b
                 + head.to(tl.int64) * stride_dq_accum_h + rows * stride_dq_accum_s
                 + offs_d[None, :], mask=mask, other=0.0)
    tl.store(dq_ptr + batch.to(tl.int64) * stride_dqb + head.to(tl.int64) * stride_dqh
             + rows * stride_dqs + offs_d[None, :], (dq * softmax_scale).to(dq_ptr.dtype.element_ty),
             mask=mask)


def _strides(prefix: str, x: torch.Tensor | None, is_varlen: bool) -> dict[str, int]:
    """{prefix}b, {prefix}s, {prefix}h: the batch, seqlen and head strides of x [B, S, H, D] or
    packed [total, H, D] (whose sequences are found through cu_seqlens: batch stride 0); zeros
    for an absent tensor."""
    if x is None:
        strides = (0, 0, 0)
    else:
        strides = (0, x.stride(0), x.stride(1)) if is_varlen else x.stride()[:3]
    return dict(zip((prefix + "b", prefix + "s", prefix + "h"), strides))


def _block_list_args(block_mask, which: str) -> tuple:
    """A block mask's partial then full lists ("kv": per query block, "q": per key block) as
    the kernels' block_lists tuple: per list its counts, indices and their b/h/row strides."""
    entries = []
    for prefix in ("", "full_"):
        counts = getattr(block_mask, f"{prefix}{which}_num_blocks")
        indices = getattr(block_mask, f"{prefix}{which}_indices")
        assert indices.stride(-1) == 1 or indices.shape[-1] <= 1, "contiguous block indices"
        assert counts.dtype == indices.dtype == torch.int32
        entries += [counts, indices, *counts.stride(), *indices.stride()[:3]]
    return tuple(entries)


def backward_workspace(q: torch.Tensor, lse: torch.Tensor, deterministic: bool):
    """(delta, dq_accum) for backward_launches: delta float32 with lse's shape, contiguous;
    dq_accum float32 with q's shape, contiguous, or None when deterministic. Neither needs
    initialising: the preprocess kernel writes delta and zeroes dq_accum."""
    delta = torch.empty(lse.shape, dtype=torch.float32, device=lse.device)
    dq_accum = None if deterministic else torch.empty(q.shape, dtype=torch.float32, device=q.device)
    return delta, dq_accum


def _hopper_masks(arch: Arch, block_mask, score_mod, mask_mod, window_left: int,
                  window_right: int) -> bool:
    """What the Gluon backward kernels mask: sm90, no hooks, no block mask, no window but
    causal's."""
    return (arch.name == "sm90" and block_mask is None and score_mod is None
            and mask_mod is None and window_left < 0 and window_right in (-1, 0))


def gluon_applies(q, k, v, dout, arch: Arch, is_varlen: bool, block_mask,
                  score_mod, mask_mod, window_left: int, window_right: int) -> bool:
    """Whether sm90_bwd's Gluon kernels can compute this call: dense inputs sm90_bwd.supports()
    accepts with _hopper_masks' masks (each kernel then runs where its table has a row for the
    head dims)."""
    return (not is_varlen and _hopper_masks(arch, block_mask, score_mod, mask_mod, window_left,
                                            window_right)
            and sm90_bwd.supports(q, k, v, dout))


def fused_applies(q, k, v, dout, lse, arch: Arch, kernel: str, *, is_varlen: bool, score_mod,
                  window_left: int, window_right: int, block_mask=None, mask_mod=None) -> bool:
    """Whether a non-deterministic backward of these dense or packed inputs runs
    sm90_bwd_fused's kernel (kernel: dispatch.backward_kernel's choice): the ops then take the
    atomic dQ, elsewhere the fixed-order pass."""
    return (kernel == "sm90" and _hopper_masks(arch, block_mask, score_mod, mask_mod,
                                               window_left, window_right)
            and sm90_bwd_fused.supports(q, k, v, dout, lse, is_varlen))


def backward_launches(q, k, v, out, lse, dout, dq, dk, dv, delta, dq_accum, *, causal: bool,
                      dlse=None,
                      softmax_scale: float, window_left: int, window_right: int,
                      cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                      score_mod=None, score_mod_grad=None, mask_mod=None, mod_args=(),
                      block_mask=None, arch: Arch, dkdv_tiles: TileConfig | None = None,
                      dq_tiles: TileConfig | None = None,
                      kernel: str = "portable") -> list[KernelLaunch]:
    """The launches of one backward, in order, for checked inputs and a workspace from
    backward_workspace (dq_accum None: the deterministic dQ kernel). dkdv_tiles / dq_tiles
    override the config tables' rows (tests, tuning, tiles that divide a block mask's blocks).
    dlse: the gradient of lse (lse's shape and layout, float32), or None. block_mask: None or
    a flex.block_mask.BlockMaskTensors with its transposed (q_*) lists, for dense inputs
    without causal or window bounds; mask_mod then applies in its partial blocks only.
    kernel: "portable", or "sm90" (dispatch.backward_kernel's choice): sm90_bwd.py's Gluon
    kernels where gluon_applies, their tables have a row and no tiles are given, else the
    portable ones."""
    is_varlen = cu_seqlens_q is not None
    assert q.dtype in (torch.float16, torch.bfloat16) and k.dtype == v.dtype == q.dtype, q.dtype
    assert all(x.stride(-1) == 1 for x in (q, k, v, out, dout, dq, dk, dv)), "contiguous last dims"
    assert lse.dtype == torch.float32 and lse.is_contiguous(), "lse: contiguous float32"
    assert delta.shape == lse.shape and delta.is_contiguous()
    assert dlse is None or (dlse.shape == lse.shape and dlse.stride() == lse.stride()
                            and dlse.dtype == torch.float32), "dlse: lse's float32 layout"
    assert score_mod_grad is not None or score_mod is None, "a score_mod needs its score_mod_grad"
    num_q_heads, head_dim = q.shape[-2], q.shape[-1]
    num_kv_heads, head_dim_v = k.shape[-2], v.shape[-1]
    if is_varlen:
        assert cu_seqlens_k is not None and max_seqlen_q is not None and max_seqlen_k is not None
        batch, seqlen_q, seqlen_k = cu_seqlens_q.shape[0] - 1, max_seqlen_q, max_seqlen_k
    else:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
    if causal:
        window_right = 0
    dkdv_tiles_given, dq_tiles_given = dkdv_tiles, dq_tiles
    dkdv_tiles = dkdv_tiles or dkdv_config(arch, head_dim, head_dim_v, dq_accum is not None)
    dq_tiles = dq_tiles or dq_config(arch, head_dim, head_dim_v)
    block_sizes = dict(BLOCK_MASK_Q=0, BLOCK_MASK_KV=0)
    if block_mask is not None:
        assert not is_varlen and window_left < 0 and window_right < 0, "a block mask is literal"
        assert block_mask.q_num_blocks is not None, "the backward needs the transposed lists"
        block_sizes = dict(BLOCK_MASK_Q=block_mask.q_block_size,
                           BLOCK_MASK_KV=block_mask.kv_block_size)
        for tiles in (dkdv_tiles, dq_tiles):
            assert (block_mask.q_block_size % tiles.block_m == 0
                    and block_mask.kv_block_size % tiles.block_n == 0), "tiles divide the blocks"
    rows_per_program = ROWS_PER_PROGRAM.get(arch.name, DEFAULT_ROWS_PER_PROGRAM)
    atomic_dq = dq_accum is not None
    # lse and delta: [B, Hq, Sq] or packed [Hq, total_q], seqlen contiguous, same strides.
    lse_strides = (dict(stride_lse_b=0, stride_lse_h=lse.stride(0)) if is_varlen
                   else dict(stride_lse_b=lse.stride(0), stride_lse_h=lse.stride(1)))
    head_dims = dict(HEAD_DIM=head_dim, HEAD_DIM_V=head_dim_v, HEAD_DIM_PAD=padded_head_dim(head_dim),
                     HEAD_DIM_V_PAD=padded_head_dim(head_dim_v))
    dq_accum_strides = _strides("stride_dq_accum_", dq_accum, is_varlen)
    row_grid = (triton.cdiv(seqlen_q, rows_per_program), num_q_heads, batch)
    fused = atomic_dq and dkdv_tiles_given is None and fused_applies(
        q, k, v, dout, lse, arch, kernel, is_varlen=is_varlen, score_mod=score_mod,
        window_left=window_left, window_right=window_right, block_mask=block_mask,
        mask_mod=mask_mod)
    # Dense fused calls without a mask (sm90_bwd_fused.first_block_stores): key block 0's launch
    # stores dQ into every query row and the others add to it, so dq_accum is zeroed only where
    # there is no key (and no launch).
    split = fused and sm90_bwd_fused.first_block_stores(q, v, is_varlen, window_right == 0)
    zero_rows = 0 if split and seqlen_k > 0 else seqlen_q

    preprocess = KernelLaunch(
        attention_bwd_preprocess_kernel, row_grid,
        dict(out_ptr=out, do_ptr=dout, dlse_ptr=dlse, delta_ptr=delta, dq_accum_ptr=dq_accum,
             cu_seqlens_q=cu_seqlens_q, **_strides("stride_o", out, is_varlen),
             **_strides("stride_do", dout, is_varlen), **lse_strides, **dq_accum_strides,
             seqlen_q=seqlen_q, zero_rows=zero_rows),
        dict(head_dims, BLOCK_M=rows_per_program, IS_VARLEN=is_varlen, ZERO_DQ_ACCUM=atomic_dq,
             HAS_DLSE=dlse is not None),
        num_warps=4, num_stages=1)

    def common():
        """The portable dK/dV and dQ kernels' shared arguments (made only where one runs: the
        host time of a short backward is its launch setup)."""
        return dict(q_ptr=q, k_ptr=k, v_ptr=v, do_ptr=dout, lse_ptr=lse, delta_ptr=delta,
                    cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                    **_strides("stride_q", q, is_varlen), **_strides("stride_k", k, is_varlen),
                    **_strides("stride_v", v, is_varlen),
                    **_strides("stride_do", dout, is_varlen), **lse_strides, seqlen_q=seqlen_q,
                    seqlen_k=seqlen_k, gqa_group_size=num_q_heads // num_kv_heads,
                    softmax_scale=float(softmax_scale), window_left=window_left,
                    window_right=window_right, mod_args=tuple(mod_args))
    masks = dict(BOUNDED_LEFT=window_left >= 0, BOUNDED_RIGHT=window_right >= 0,
                 SCORE_MOD=score_mod, SCORE_MOD_GRAD=score_mod_grad, MASK_MOD=mask_mod)
    assert kernel in ("portable", "sm90"), kernel
    hopper = kernel == "sm90" and gluon_applies(q, k, v, dout, arch, is_varlen, block_mask,
                                                 score_mod, mask_mod, window_left, window_right)
    width = sm90_bwd.width(q, v)
    shared = {}     # the Gluon kernels' common arguments, made once where their tiles match
    # dK/dV's launches (the fused kernel's, dQ included, may be two: key block 0, then the rest).
    if fused:
        dkdv = [sm90_bwd_fused.fused_sm90_launch(
            q, k, v, dout, lse, delta, dq_accum, dk, dv, causal=window_right == 0,
            softmax_scale=softmax_scale, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, part=part)
            for part in (("first", "rest") if split else ("all",))]
    elif hopper and not atomic_dq and dkdv_tiles_given is None and width in sm90_bwd.DKDV_CONFIGS:
        dkdv = [sm90_bwd.dkdv_sm90_launch(q, k, v, dout, lse, delta, dk, dv,
                                          causal=window_right == 0, softmax_scale=softmax_scale,
                                          shared=shared)]
    else:
        dkdv = [KernelLaunch(
            attention_bwd_dkdv_kernel, (triton.cdiv(seqlen_k, dkdv_tiles.block_n), num_kv_heads, batch),
            dict(common(), dq_accum_ptr=dq_accum, dk_ptr=dk, dv_ptr=dv, **dq_accum_strides,
                 **_strides("stride_dk", dk, is_varlen), **_strides("stride_dv", dv, is_varlen),
                 block_lists=() if block_mask is None else _block_list_args(block_mask, "q")),
            dict(head_dims, BLOCK_M=dkdv_tiles.block_m, BLOCK_N=dkdv_tiles.block_n,
                 IS_VARLEN=is_varlen, ATOMIC_DQ=atomic_dq, **masks, **block_sizes),
            dkdv_tiles.num_warps, dkdv_tiles.num_stages)]
    if atomic_dq:
        finish_dq = KernelLaunch(
            attention_bwd_dq_convert_kernel, row_grid,
            dict(dq_accum_ptr=dq_accum, dq_ptr=dq, cu_seqlens_q=cu_seqlens_q, **dq_accum_strides,
                 **_strides("stride_dq", dq, is_varlen), seqlen_q=seqlen_q,
                 softmax_scale=float(softmax_scale)),
            dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=padded_head_dim(head_dim),
                 BLOCK_M=rows_per_program, IS_VARLEN=is_varlen),
            num_warps=4, num_stages=1)
    elif hopper and dq_tiles_given is None and width in sm90_bwd.DQ_CONFIGS:
        finish_dq = sm90_bwd.dq_sm90_launch(q, k, v, dout, lse, delta, dq,
                                            causal=window_right == 0, softmax_scale=softmax_scale,
                                            shared=shared)
    else:
        finish_dq = KernelLaunch(
            attention_bwd_dq_kernel, (triton.cdiv(seqlen_q, dq_tiles.block_m), num_q_heads, batch),
            dict(common(), dq_ptr=dq, **_strides("stride_dq", dq, is_varlen),
                 block_lists=() if block_mask is None else _block_list_args(block_mask, "kv")),
            dict(head_dims, BLOCK_M=dq_tiles.block_m, BLOCK_N=dq_tiles.block_n,
                 IS_VARLEN=is_varlen, **masks, **block_sizes),
            dq_tiles.num_warps, dq_tiles.num_stages)
    # A varlen batch whose sequences are all empty on one side has nothing to launch there.
    return [launch for launch in (preprocess, *dkdv, finish_dq) if all(launch.grid)]


def attention_backward(q, k, v, out, lse, dout, dq, dk, dv, *, causal: bool, softmax_scale: float,
                       dlse=None,
                       window_left: int, window_right: int, cu_seqlens_q=None, cu_seqlens_k=None,
                       max_seqlen_q=None, max_seqlen_k=None, score_mod=None, score_mod_grad=None,
                       mask_mod=None, mod_args=(), block_mask=None, deterministic: bool = False,
                       arch: Arch, dkdv_tiles: TileConfig | None = None,
                       dq_tiles: TileConfig | None = None, kernel: str = "portable") -> None:
    """Write dq, dk, dv (preallocated, any strides with a contiguous last dim, e.g. views into
    one fused gradient buffer) for checked inputs. Allocates only its workspace (delta, and the
    fp32 dQ buffer unless deterministic). Dense: q [B, Sq, Hq, D], k [B, Sk, Hkv, D],
    v [B, Sk, Hkv, Dv], out/dout [B, Sq, Hq, Dv], lse [B, Hq, Sq]; varlen (cu_seqlens_q/k int32
    [B + 1] and max_seqlen_q/k given): q [total_q, Hq, D], k/v [total_k, Hkv, D | Dv],
    lse [Hq, total_q]. lse float32, natural log, contiguous. window_left/right: -1 unbounded;
    causal overrides window_right with 0. block_mask, dkdv_tiles, dq_tiles, kernel: as
    backward_launches'."""
    delta, dq_accum = backward_workspace(q, lse, deterministic)
    for launch in backward_launches(
            q, k, v, out, lse, dout, dq, dk, dv, delta, dq_accum, causal=causal, dlse=dlse,
            softmax_scale=softmax_scale, window_left=window_left, window_right=window_right,
            cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
            max_seqlen_k=max_seqlen_k, score_mod=score_mod, score_mod_grad=score_mod_grad,
            mask_mod=mask_mod, mod_args=mod_args, block_mask=block_mask, arch=arch,
            dkdv_tiles=dkdv_tiles, dq_tiles=dq_tiles, kernel=kernel):
        launch.run()
