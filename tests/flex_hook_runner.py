"""Run translated hooks (tileattn.flex) over a whole (batch, head, q_idx, kv_idx) grid with a
tiny Triton kernel, and evaluate the same Python functions with torch eagerly, as
FlexAttention's eager path does (vmap over int32 indices, tensor indexing as aten.index).

The kernel calls each hook as the attention kernels do (mods.md): score fp32 [BLOCK, BLOCK],
batch and head scalars, q_idx [BLOCK, 1] and kv_idx [1, BLOCK] — or, with transposed=True,
key-major tiles (q_idx [1, BLOCK], kv_idx [BLOCK, 1]) as a backward kernel may use. Tiles
cover positions past the grid's end too (hooks must tolerate them); only the grid is stored.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 16


@triton.jit
def _tile(rows, cols, TRANSPOSED: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    col = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    if TRANSPOSED:
        q_idx = row[None, :]
        kv_idx = col[:, None]
    else:
        q_idx = row[:, None]
        kv_idx = col[None, :]
    offsets = tl.program_id(0).to(tl.int64) * rows * cols + q_idx * cols + kv_idx
    return q_idx, kv_idx, offsets, (q_idx < rows) & (kv_idx < cols)


@triton.jit
def score_mod_grid_kernel(score_ptr, out_ptr, mod_args, num_heads, rows, cols,
                          SCORE_MOD: tl.constexpr, TRANSPOSED: tl.constexpr,
                          BLOCK: tl.constexpr):
    """score, out: float32 [batch, num_heads, rows, cols] contiguous; out = SCORE_MOD(score)."""
    batch = tl.program_id(0) // num_heads
    head = tl.program_id(0) % num_heads
    q_idx, kv_idx, offsets, inside = _tile(rows, cols, TRANSPOSED, BLOCK)
    score = tl.load(score_ptr + offsets, mask=inside, other=0.0)
    result = SCORE_MOD(score, batch, head, q_idx, kv_idx, 0, mod_args)
    tl.store(out_ptr + offsets, result, mask=inside)


@triton.jit
def mask_mod_grid_kernel(out_ptr, mod_args, num_heads, rows, cols,
                         MASK_MOD: tl.constexpr, TRANSPOSED: tl.constexpr, BLOCK: tl.constexpr):
    """out: int8 [batch, num_heads, rows, cols] contiguous; out = MASK_MOD(...)."""
    batch = tl.program_id(0) // num_heads
    head = tl.program_id(0) % num_heads
    q_idx, kv_idx, offsets, inside = _tile(rows, cols, TRANSPOSED, BLOCK)
    keep = MASK_MOD(batch, head, q_idx, kv_idx, 0, mod_args)
    tl.store(out_ptr + offsets, keep.to(tl.int8), mask=inside)


def _grid(batch, heads, rows, cols):
    return (batch * heads, triton.cdiv(rows, BLOCK), triton.cdiv(cols, BLOCK))


def run_score_hook(hook, mod_args, scores: torch.Tensor, transposed: bool = False):
    """hook(score) at every position of scores [batch, heads, rows, cols] (float32)."""
    batch, heads, rows, cols = scores.shape
    scores = scores.contiguous()
    out = torch.full_like(scores, float("nan"))
    score_mod_grid_kernel[_grid(batch, heads, rows, cols)](
        scores, out, tuple(mod_args), heads, rows, cols, hook, transposed, BLOCK)
    return out


def run_mask_hook(hook, mod_args, batch, heads, rows, cols, device="cpu",
                  transposed: bool = False):
    """hook(...) at every position of a [batch, heads, rows, cols] grid, as bool."""
    out = torch.full((batch, heads, rows, cols), 7, dtype=torch.int8, device=device)
    mask_mod_grid_kernel[_grid(batch, heads, rows, cols)](
        out, tuple(mod_args), heads, rows, cols, hook, transposed, BLOCK)
    assert ((out == 0) | (out == 1)).all(), "the mask kernel left positions unwritten"
    return out.bool()


def _indices(batch, heads, rows, cols, device):
    return tuple(torch.arange(n, dtype=torch.int32, device=device)
                 for n in (batch, heads, rows, cols))


def eager_score_mod(fn, scores: torch.Tensor) -> torch.Tensor:
    """fn applied elementwise by torch (FlexAttention's eager evaluation, int32 indices)."""
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
    from torch.nn.attention.flex_attention import _vmap_for_bhqkv
    with TransformGetItemToIndex():
        return _vmap_for_bhqkv(fn, prefix=(0,))(scores, *_indices(*scores.shape, scores.device))


def eager_score_mod_grad(fn, scores: torch.Tensor) -> torch.Tensor:
    """d fn / d score at every position, by torch.autograd on the eager evaluation."""
    scores = scores.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        out = eager_score_mod(fn, scores)
        (grad,) = torch.autograd.grad(out.sum(), scores)
    return grad


def eager_mask_mod(fn, batch, heads, rows, cols, device="cpu") -> torch.Tensor:
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
    from torch.nn.attention.flex_attention import _vmap_for_bhqkv
    with TransformGetItemToIndex():
        mask = _vmap_for_bhqkv(fn, prefix=())(*_indices(batch, heads, rows, cols, device))
    return mask.expand(batch, heads, rows, cols).bool()
