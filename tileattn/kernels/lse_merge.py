"""In-place LSE merge of two partial attention results over disjoint key sets (the context-
parallel ring's step, tileattn/distributed/ring.py): one pass that reads both outputs and
LSEs and writes the merged ones, where torch's elementwise ops make five passes over the fp32
outputs (docs/design.md, "Context parallelism").

    out, lse <- softmax-weighted union of (out, lse) and (block_out, block_lse):
    lse = logaddexp(lse, block_lse), out = exp(lse_old - lse) out + exp(block_lse - lse) block_out

A row that no key reached on either side (both LSEs -inf, outputs 0) keeps lse -inf and
output 0. Tensors (element strides; last dim contiguous):
    out, block_out  float32 (float64 too: the tests) [B, S, H, D]
    lse, block_lse  the same dtype, [B, H, S], natural log
One program per (BLOCK_S positions, batch · head).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .runtime import KernelLaunch

BLOCK_S = 64
NUM_WARPS = 4


@triton.jit
def lse_merge_kernel(
    out_ptr, lse_ptr, block_out_ptr, block_lse_ptr,
    stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_ls,
    stride_bob, stride_bos, stride_boh, stride_blb, stride_blh, stride_bls,
    seqlen, num_heads, head_dim,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    batch = tl.program_id(1) // num_heads
    head = tl.program_id(1) % num_heads
    offs_s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    rows = offs_s < seqlen
    lse_at = lse_ptr + batch * stride_lb + head * stride_lh + offs_s * stride_ls
    lse_a = tl.load(lse_at, mask=rows, other=float("-inf"))
    lse_b = tl.load(block_lse_ptr + batch * stride_blb + head * stride_blh + offs_s * stride_bls,
                    mask=rows, other=float("-inf"))
    # Weights against the larger LSE (0 where both are -inf, so that no NaN appears).
    top = tl.maximum(lse_a, lse_b)
    top = tl.where(top == float("-inf"), 0.0, top)
    weight_a = tl.exp(lse_a - top)
    weight_b = tl.exp(lse_b - top)
    total = weight_a + weight_b
    seen = total > 0
    merged = tl.where(seen, top + tl.log(tl.where(seen, total, 1.0)), float("-inf"))
    weight_a = tl.where(seen, weight_a / total, 0.0)
    weight_b = tl.where(seen, weight_b / total, 0.0)

    tile = rows[:, None] & (offs_d < head_dim)[None, :]
    out_at = (out_ptr + batch * stride_ob + head * stride_oh
              + offs_s[:, None].to(tl.int64) * stride_os + offs_d[None, :])
    block_at = (block_out_ptr + batch * stride_bob + head * stride_boh
                + offs_s[:, None].to(tl.int64) * stride_bos + offs_d[None, :])
    out_a = tl.load(out_at, mask=tile, other=0.0)
    out_b = tl.load(block_at, mask=tile, other=0.0)
    tl.store(out_at, out_a * weight_a[:, None] + out_b * weight_b[:, None], mask=tile)
    tl.store(lse_at, merged, mask=rows)


def lse_merge_launch(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor,
                     block_lse: torch.Tensor) -> KernelLaunch:
    """The merge of (block_out, block_lse) into (out, lse), in place (module docstring)."""
    batch, seqlen, num_heads, head_dim = out.shape
    assert out.dtype == block_out.dtype == lse.dtype == block_lse.dtype
    assert out.stride(3) == 1 and block_out.stride(3) == 1 and block_out.shape == out.shape
    args = dict(out_ptr=out, lse_ptr=lse, block_out_ptr=block_out, block_lse_ptr=block_lse,
                stride_ob=out.stride(0), stride_os=out.stride(1), stride_oh=out.stride(2),
                stride_lb=lse.stride(0), stride_lh=lse.stride(1), stride_ls=lse.stride(2),
                stride_bob=block_out.stride(0), stride_bos=block_out.stride(1),
                stride_boh=block_out.stride(2), stride_blb=block_lse.stride(0),
                stride_blh=block_lse.stride(1), stride_bls=block_lse.stride(2),
                seqlen=seqlen, num_heads=num_heads, head_dim=head_dim)
    grid = (triton.cdiv(seqlen, BLOCK_S), batch * num_heads)
    return KernelLaunch(lse_merge_kernel, grid, args,
                        dict(BLOCK_S=BLOCK_S, BLOCK_D=triton.next_power_of_2(head_dim)),
                        NUM_WARPS, 1)
