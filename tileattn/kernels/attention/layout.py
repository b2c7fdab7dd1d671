"""Layout kernels: the K-major copy of V that FP8 P@V needs on sm89/sm90.

torch's generic strided copy moves 1-byte elements through an uncoalesced gather, many times
slower than the bytes need (docs/design.md, "FP8 and V layout"); a tiled transpose reads rows of
head_dim and writes rows of seqlen, both coalesced, with the turn done in registers and shared
memory by the compiler.

Pointer layouts:
    v    [batch, seqlen, heads, head_dim]  last dim contiguous (any other strides)
    out  [batch, heads, head_dim, width]  contiguous, width = k_major_width(seqlen): rows
                                          padded to whole KEY_GROUP key groups, zero-filled
With GROUPED, the keys of each group of 16 are stored in the order key_at_grouped_position
gives: the order in which the Hopper kernel's FP8 P leaves its S accumulator, so that P reaches
P @ V without a register shuffle (sm90_consumers.Consumer.p_operand).

Packed (varlen) V, [total_k, heads, head_dim], is copied to [heads, head_dim, packed_v_width]
contiguous with sequence b's keys starting at column packed_v_start(b): a multiple of
V_ALIGN keys, so that the attention kernel's loads of a V tile along the keys stay vectorized
(a sequence's own first key can sit at any offset).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..runtime import KernelLaunch

BLOCK_S = 64


# Keys a K-major copy's rows are padded to (and the groups GROUPED reorders within).
KEY_GROUP = tl.constexpr(16)


def k_major_width(seqlen: int) -> int:
    """Columns of a K-major copy of seqlen keys: whole KEY_GROUP groups (also 16-byte aligned
    rows for TMA at any seqlen)."""
    return -(-seqlen // KEY_GROUP.value) * KEY_GROUP.value


@triton.jit
def key_at_grouped_position(position):
    """The key GROUPED stores at column 16a + 4q + 2j + b: 16a + 8j + 2q + b. On wgmma, thread q
    of a quad holds S columns 8j + 2q + b of each 16, and an 8-bit A operand's thread q holds
    columns 4q .. 4q + 3 of each 16."""
    rest = position % 16
    return position - rest + (rest // 2 % 2) * 8 + (rest // 4) * 2 + rest % 2


@triton.jit
def transpose_v_kernel(
    v_ptr, out_ptr,
    stride_vb, stride_vs, stride_vh,
    seqlen, num_heads, width,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_S: tl.constexpr,
    GROUPED: tl.constexpr,
):
    block_s = tl.program_id(0)
    batch_head = tl.program_id(1)
    batch = batch_head // num_heads
    head = batch_head % num_heads
    # Columns of out; GROUPED gathers their keys (rows of v) so that the stores stay contiguous.
    offs_s = block_s * BLOCK_S + tl.arange(0, BLOCK_S)
    keys = key_at_grouped_position(offs_s) if GROUPED else offs_s
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    src = (v_ptr + batch.to(tl.int64) * stride_vb + head.to(tl.int64) * stride_vh
           + keys[:, None].to(tl.int64) * stride_vs + offs_d[None, :])
    tile = tl.load(src, mask=(keys[:, None] < seqlen) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    dst = (out_ptr + batch_head.to(tl.int64) * HEAD_DIM * width
           + offs_d[None, :].to(tl.int64) * width + offs_s[:, None])
    # Padding keys (seqlen <= key < width) are written as zeros.
    tl.store(dst, tile, mask=(offs_s[:, None] < width) & (offs_d[None, :] < HEAD_DIM))


def transpose_v_launch(v: torch.Tensor, out: torch.Tensor, grouped: bool = False) -> KernelLaunch:
    """Launch writing v [B, S, H, D] (last dim contiguous) into out [B, H, D, k_major_width(S)]
    (contiguous), in grouped key order with `grouped`."""
    batch, seqlen, num_heads, head_dim = v.shape
    width = k_major_width(seqlen)
    if out.shape != (batch, num_heads, head_dim, width) or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous [{batch}, {num_heads}, {head_dim}, "
                         f"{width}] tensor, got {tuple(out.shape)}")
    args = dict(v_ptr=v, out_ptr=out, stride_vb=v.stride(0), stride_vs=v.stride(1),
                stride_vh=v.stride(2), seqlen=seqlen, num_heads=num_heads, width=width)
    constexprs = dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=1 << (head_dim - 1).bit_length(),
                      BLOCK_S=BLOCK_S, GROUPED=grouped)
    grid = (-(-width // BLOCK_S), batch * num_heads)
    return KernelLaunch(transpose_v_kernel, grid, args, constexprs, num_warps=4, num_stages=1)


# Keys a packed K-major V's sequences start at multiples of (16 bytes of FP8).
V_ALIGN = tl.constexpr(16)


@triton.jit
def packed_v_start(k_first, batch):
    """Column of sequence `batch`'s first key in a packed K-major V copy, for its first key row
    k_first (clamped to total_k): moved on by V_ALIGN a sequence before it and rounded up to
    V_ALIGN, so it is aligned, after the previous sequence's last key (for non-decreasing
    cu_seqlens_k) and below packed_v_width(total_k, batch count) whatever cu_seqlens_k holds."""
    return (k_first + V_ALIGN * batch + V_ALIGN - 1) // V_ALIGN * V_ALIGN


def packed_v_width(total_k: int, batch: int) -> int:
    """Columns of a packed K-major V copy: every packed_v_start(b) + its keys fit below."""
    align = V_ALIGN.value
    return -(-(total_k + align * (batch + 1)) // align) * align


@triton.jit
def transpose_packed_v_kernel(
    v_ptr, out_ptr, cu_seqlens_k_ptr, stride_vs, stride_vh, total_k, width,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_S: tl.constexpr,
):
    block_s = tl.program_id(0)
    batch = tl.program_id(1)
    head = tl.program_id(2)
    # Clamped as the attention kernel clamps them: no read or write outside either tensor.
    k_first = tl.minimum(tl.load(cu_seqlens_k_ptr + batch), total_k)
    seqlen = tl.maximum(tl.minimum(tl.load(cu_seqlens_k_ptr + batch + 1), total_k) - k_first, 0)
    if block_s * BLOCK_S >= seqlen:
        return
    offs_s = block_s * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask = (offs_s[:, None] < seqlen) & (offs_d[None, :] < HEAD_DIM)
    src = (v_ptr + head.to(tl.int64) * stride_vh
           + (k_first + offs_s)[:, None].to(tl.int64) * stride_vs + offs_d[None, :])
    tile = tl.load(src, mask=mask, other=0.0)
    start = packed_v_start(k_first, batch)
    dst = (out_ptr + head.to(tl.int64) * HEAD_DIM * width + offs_d[None, :].to(tl.int64) * width
           + (start + offs_s)[:, None])
    tl.store(dst, tile, mask=mask)


def transpose_packed_v_launch(v: torch.Tensor, out: torch.Tensor, cu_seqlens_k: torch.Tensor,
                              max_seqlen_k: int) -> KernelLaunch:
    """Launch writing packed v [total_k, H, D] (last dim contiguous) into out [H, D, width]
    (contiguous, width = packed_v_width), sequence b at column packed_v_start(b)."""
    total_k, num_heads, head_dim = v.shape
    batch = cu_seqlens_k.shape[0] - 1
    width = packed_v_width(total_k, batch)
    if out.shape != (num_heads, head_dim, width) or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous [{num_heads}, {head_dim}, {width}] tensor, "
                         f"got {tuple(out.shape)}")
    args = dict(v_ptr=v, out_ptr=out, cu_seqlens_k_ptr=cu_seqlens_k, stride_vs=v.stride(0),
                stride_vh=v.stride(1), total_k=total_k, width=width)
    constexprs = dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=1 << (head_dim - 1).bit_length(),
                      BLOCK_S=BLOCK_S)
    grid = (max(-(-max_seqlen_k // BLOCK_S), 1), batch, num_heads)
    return KernelLaunch(transpose_packed_v_kernel, grid, args, constexprs, num_warps=4,
                        num_stages=1)


def is_k_major(v: torch.Tensor) -> bool:
    """V [B, S, H, D] whose sequence dim is contiguous (what FP8 P@V wants on sm89/sm90)."""
    return v.stride(1) == 1 and v.stride(3) != 1
