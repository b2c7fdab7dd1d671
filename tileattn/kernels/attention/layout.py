"""Layout kernels: the K-major copy of V that FP8 P@V needs on sm89/sm90.

torch's generic strided copy moves 1-byte elements through an uncoalesced gather, many times
slower than the bytes need (docs/design.md, "FP8 and V layout"); a tiled transpose reads rows of
head_dim and writes rows of seqlen, both coalesced, with the turn done in registers and shared
memory by the compiler.

Pointer layouts:
    v    [batch, seqlen, heads, head_dim]  last dim contiguous (any other strides)
    out  [batch, heads, head_dim, seqlen] contiguous
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..runtime import KernelLaunch

BLOCK_S = 64


@triton.jit
def transpose_v_kernel(
    v_ptr, out_ptr,
    stride_vb, stride_vs, stride_vh,
    seqlen, num_heads,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_S: tl.constexpr,
):
    block_s = tl.program_id(0)
    batch_head = tl.program_id(1)
    batch = batch_head // num_heads
    head = batch_head % num_heads
    offs_s = block_s * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    src = (v_ptr + batch.to(tl.int64) * stride_vb + head.to(tl.int64) * stride_vh
           + offs_s[:, None].to(tl.int64) * stride_vs + offs_d[None, :])
    tile = tl.load(src, mask=(offs_s[:, None] < seqlen) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    dst = (out_ptr + batch_head.to(tl.int64) * HEAD_DIM * seqlen
           + offs_d[None, :].to(tl.int64) * seqlen + offs_s[:, None])
    tl.store(dst, tile, mask=(offs_s[:, None] < seqlen) & (offs_d[None, :] < HEAD_DIM))


def transpose_v_launch(v: torch.Tensor, out: torch.Tensor) -> KernelLaunch:
    """Launch writing v [B, S, H, D] (last dim contiguous) into out [B, H, D, S] (contiguous)."""
    batch, seqlen, num_heads, head_dim = v.shape
    if out.shape != (batch, num_heads, head_dim, seqlen) or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous [{batch}, {num_heads}, {head_dim}, "
                         f"{seqlen}] tensor, got {tuple(out.shape)}")
    args = dict(v_ptr=v, out_ptr=out, stride_vb=v.stride(0), stride_vs=v.stride(1),
                stride_vh=v.stride(2), seqlen=seqlen, num_heads=num_heads)
    constexprs = dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=1 << (head_dim - 1).bit_length(),
                      BLOCK_S=BLOCK_S)
    grid = (-(-seqlen // BLOCK_S), batch * num_heads)
    return KernelLaunch(transpose_v_kernel, grid, args, constexprs, num_warps=4, num_stages=1)


def is_k_major(v: torch.Tensor) -> bool:
    """V [B, S, H, D] whose sequence dim is contiguous (what FP8 P@V wants on sm89/sm90)."""
    return v.stride(1) == 1 and v.stride(3) != 1
