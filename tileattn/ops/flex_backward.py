"""flex_attention's backward for 16-bit inputs: an autograd.Function whose forward is the flex
forward (ops/flex.py) and whose backward runs the attention backward kernels
(kernels/attention/bwd.py) with the translated score_mod, its derivative, the mask_mod, and
the BlockMask's lists: the dQ pass walks each query block's listed key blocks, the dK/dV pass
each key block's listed query blocks (the transposed lists), partial blocks with the mask hook
and full ones without, as the forward does (docs/design.md, "FlexAttention").

flex_attention is not a torch.library op (its arguments include Python functions), so this
Function is its autograd. The forward saves q, k, v, out and lse; the backward adds delta.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..arch import arch_of
from ..flex.block_mask import BlockMaskTensors, block_mask_tensors, largest_tile
from ..flex.translate import translate_mods
from ..kernels.attention import bwd
from ..kernels.runtime import on_device


@dataclass(frozen=True)
class BackwardPlan:
    """What a call's backward needs besides the saved tensors: the hooks (score_mod_grad set
    with any score_mod), their mod_args, and the block lists with their transposes (or None:
    every key block visited, mask_mod everywhere)."""
    softmax_scale: float
    score_mod: object
    score_mod_grad: object
    mask_mod: object
    mod_args: tuple
    block_lists: BlockMaskTensors | None


def backward_plan(score_mod, block_mask, *, batch: int, num_q_heads: int, seqlen_q: int,
                  seqlen_k: int, softmax_scale: float, device) -> BackwardPlan:
    """The plan of a call whose inputs require grad. Translating the derivative here, at the
    forward, reports an untranslatable derivative or a captured tensor that requires grad
    before any work is done."""
    mask_mod = None if block_mask is None else block_mask.mask_mod
    hooks = translate_mods(score_mod, mask_mod, device=device, with_grad=True)
    block_lists = None
    if block_mask is not None:
        block_lists = block_mask_tensors(block_mask, batch=batch, num_q_heads=num_q_heads,
                                         seqlen_q=seqlen_q, seqlen_k=seqlen_k, device=device,
                                         transposed=True)
        block_lists = _contiguous_indices(block_lists) if block_lists is not None else None
    return BackwardPlan(softmax_scale, hooks.score_mod, hooks.score_mod_grad, hooks.mask_mod,
                        tuple(hooks.mod_args), block_lists)


def _contiguous_indices(lists: BlockMaskTensors) -> BlockMaskTensors:
    """The kernels step through an index row by pointer increments: its last dim must be
    contiguous (BlockMasks' are; a sliced or user-made one may not be)."""
    changes = {}
    for field in ("kv_indices", "full_kv_indices", "q_indices", "full_q_indices"):
        indices = getattr(lists, field)
        if indices.shape[-1] > 1 and indices.stride(-1) != 1:
            changes[field] = indices.contiguous()
    return dataclasses.replace(lists, **changes) if changes else lists


class FlexAttentionFunction(torch.autograd.Function):
    """apply(query, key, value, run_forward, plan) -> (out, lse); run_forward() returns
    out [B, Hq, Sq, Dv] and lse [B, Hq, Sq] (float32, natural log); plan a BackwardPlan."""

    @staticmethod
    def forward(ctx, query, key, value, run_forward, plan):
        out, lse = run_forward()
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.plan = plan
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        query, key, value, out, lse = ctx.saved_tensors
        dq, dk, dv = flex_backward(query, key, value, out, lse, dout, dlse, ctx.plan)
        return dq, dk, dv, None, None


def flex_backward(query, key, value, out, lse, dout, dlse, plan: BackwardPlan):
    """(dq, dk, dv) in the inputs' shapes and dtypes, [B, H, S, D] as flex's; dout / dlse may
    be None (no gradient reached out / lse)."""
    batch = query.shape[0]
    if query.numel() == 0 or key.numel() == 0 or (dout is None and dlse is None):
        return torch.zeros_like(query), torch.zeros_like(key), torch.zeros_like(value)
    dout = torch.zeros_like(out) if dout is None else dout.contiguous()
    # One K/V for every batch entry (stride 0): gradients per entry, summed after.
    key_all, value_all = (x.expand(batch, *x.shape[1:]) for x in (key, value))
    dq = torch.empty_like(query)
    dk = torch.empty(key_all.shape, dtype=key.dtype, device=key.device)
    dv = torch.empty(value_all.shape, dtype=value.dtype, device=value.device)
    arch = arch_of(query.device)
    head_dim, head_dim_v = query.shape[3], value.shape[3]
    dkdv_tiles = bwd.dkdv_config(arch, head_dim, head_dim_v)
    dq_tiles = bwd.dq_config(arch, head_dim, head_dim_v)
    lists = plan.block_lists
    if lists is not None:     # tiles inside mask blocks, as the forward's (ops/flex.py)
        dkdv_tiles, dq_tiles = (dataclasses.replace(
            tiles, block_m=largest_tile(lists.q_block_size, tiles.block_m),
            block_n=largest_tile(lists.kv_block_size, tiles.block_n))
            for tiles in (dkdv_tiles, dq_tiles))
    with on_device(query.device):
        bwd.attention_backward(
            query.transpose(1, 2), key_all.transpose(1, 2), value_all.transpose(1, 2),
            out.transpose(1, 2), lse, dout.transpose(1, 2), dq.transpose(1, 2),
            dk.transpose(1, 2), dv.transpose(1, 2), causal=False,
            softmax_scale=plan.softmax_scale,
            dlse=None if dlse is None else dlse.contiguous(), window_left=-1, window_right=-1,
            score_mod=plan.score_mod, score_mod_grad=plan.score_mod_grad,
            mask_mod=plan.mask_mod, mod_args=plan.mod_args, block_mask=lists,
            # The fixed-order dQ pass, as attention()'s backward (docs/design.md, "Backward").
            deterministic=True, arch=arch, dkdv_tiles=dkdv_tiles, dq_tiles=dq_tiles)
    if key.shape[0] != batch:
        dk, dv = dk.sum(0, keepdim=True), dv.sum(0, keepdim=True)
    return dq, dk, dv
