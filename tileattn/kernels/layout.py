"""Layout kernels: the K-major copy of V that FP8 P@V needs on sm89/sm90.

torch's generic strided copy moves 1-byte elements through an uncoalesced gather (measured on
H100 at ~0.45 ms for 64 MB, a quarter of an FP8 forward at N=4096); a tiled transpose reads
rows of head_dim and writes rows of seqlen, both coalesced, with the turn done in registers and
shared memory by the compiler.

Grouped key order (GROUP_KEYS; experimental, see api.groups_v_keys). On wgmma the FP8 P @ V
takes P as a register A operand whose fragment does not match the QK^T accumulator's: a thread
holds keys 2q, 2q+1 of each group of 8 in the accumulator but needs keys 4q..4q+3 of each
group of 16 in the operand, which costs shuffles and byte permutes per tile (ncu, H100,
benchmarks/NOTES.md session 4: ALU 43% in the Gluon FP8 kernel). Storing V's keys reordered
within groups of 32 — position 16a + 4q + 2j + b holds key 16a + 8j + 2q + b — lets the
kernel reorder P the same way by a reshape and permute that maps each thread's accumulator
registers onto its operand registers as they are (p_in_v_key_order), so no data moves.
Cross-compiled for sm90 (a 64 x 128 FP8 tile): 16 shfl, 16 prmt and 18 selp fewer a tile.

Pointer layouts:
    v    [batch, seqlen, heads, head_dim]  last dim contiguous (any other strides)
    out  [batch, heads, head_dim, seqlen_out] contiguous; seqlen_out = seqlen, or seqlen rounded
                                              up to KEY_GROUP with GROUP_KEYS (the padding
                                              written as zeros)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .cross_compile import KernelLaunch

BLOCK_S = 64
KEY_GROUP = 32


@triton.jit
def p_in_v_key_order(p, ROWS: tl.constexpr, KEYS: tl.constexpr):
    """P [ROWS, KEYS] (KEYS a multiple of 32) with its columns in grouped key order: column
    16a + 4q + 2j + b of each group of 32 takes key 16a + 8j + 2q + b."""
    grouped = tl.reshape(p, [ROWS, KEYS // 32, 2, 2, 4, 2])       # key = 16a + 8j + 2q + b
    return tl.reshape(tl.permute(grouped, (0, 1, 2, 4, 3, 5)), [ROWS, KEYS])


@triton.jit
def _rows_in_grouped_key_order(tile, KEYS: tl.constexpr, COLS: tl.constexpr):
    """tile [KEYS, COLS] with its rows in grouped key order: p_in_v_key_order's own reordering,
    so the copy and the kernels agree by construction."""
    return tl.trans(p_in_v_key_order(tl.trans(tile), COLS, KEYS))


@triton.jit
def transpose_v_kernel(
    v_ptr, out_ptr,
    stride_vb, stride_vs, stride_vh,
    seqlen, seqlen_out, num_heads,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_S: tl.constexpr,
    GROUP_KEYS: tl.constexpr,
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
    if GROUP_KEYS:
        # Groups of 32 never straddle programs (BLOCK_S is a multiple of 32), and keys past
        # seqlen load as 0, so the padding up to seqlen_out is written as zeros.
        tile = _rows_in_grouped_key_order(tile, BLOCK_S, HEAD_DIM_PAD)
    dst = (out_ptr + batch_head.to(tl.int64) * HEAD_DIM * seqlen_out
           + offs_d[None, :].to(tl.int64) * seqlen_out + offs_s[:, None])
    tl.store(dst, tile, mask=(offs_s[:, None] < seqlen_out) & (offs_d[None, :] < HEAD_DIM))


def grouped_seqlen(seqlen: int) -> int:
    """Keys a grouped-order copy of V holds: seqlen rounded up to KEY_GROUP."""
    return -(-seqlen // KEY_GROUP) * KEY_GROUP


def transpose_v_launch(v: torch.Tensor, out: torch.Tensor, group_keys: bool = False) -> KernelLaunch:
    """Launch writing v [B, S, H, D] (last dim contiguous) into out [B, H, D, S] (contiguous),
    or with group_keys into out [B, H, D, grouped_seqlen(S)] in grouped key order."""
    batch, seqlen, num_heads, head_dim = v.shape
    seqlen_out = grouped_seqlen(seqlen) if group_keys else seqlen
    if out.shape != (batch, num_heads, head_dim, seqlen_out) or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous [{batch}, {num_heads}, {head_dim}, "
                         f"{seqlen_out}] tensor, got {tuple(out.shape)}")
    args = dict(v_ptr=v, out_ptr=out, stride_vb=v.stride(0), stride_vs=v.stride(1),
                stride_vh=v.stride(2), seqlen=seqlen, seqlen_out=seqlen_out, num_heads=num_heads)
    constexprs = dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=1 << (head_dim - 1).bit_length(),
                      BLOCK_S=BLOCK_S, GROUP_KEYS=group_keys)
    grid = (-(-seqlen_out // BLOCK_S), batch * num_heads)
    return KernelLaunch(transpose_v_kernel, grid, args, constexprs, num_warps=4, num_stages=1)
