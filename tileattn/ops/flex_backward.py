"""flex_attention's backward for 16-bit inputs: an autograd.Function whose forward is the flex
forward (ops/flex.py) and whose backward is the attention backward kernels
(kernels/attention/bwd.py) with the translated score_mod, its derivative and the BlockMask as
one mask hook (flex/backward.py). The forward saves q, k, v, out and lse.

flex_attention is not a torch.library op (its arguments include Python functions), so this
Function is its autograd; torch.compile traces through it as through any autograd.Function.
"""

from __future__ import annotations

import torch

from ..arch import arch_of
from ..flex import backward as flex_backward
from ..kernels.attention import bwd
from ..kernels.runtime import on_device


class FlexAttentionFunction(torch.autograd.Function):
    """apply(query, key, value, run_forward, backward_hooks) -> (out, lse); run_forward()
    returns out [B, Hq, Sq, Dv] and lse [B, Hq, Sq] (float32); backward_hooks a dict of the
    backward kernels' softmax_scale, score_mod, score_mod_grad, mask_mod and mod_args."""

    @staticmethod
    def forward(ctx, query, key, value, run_forward, backward_hooks):
        out, lse = run_forward()
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.hooks = backward_hooks
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        query, key, value, out, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        batch = query.shape[0]
        # One K/V for every batch entry (stride 0): gradients per entry, summed after.
        key_full, value_full = (x.expand(batch, *x.shape[1:]) for x in (key, value))
        dq = torch.empty_like(query)
        dk = torch.empty(key_full.shape, dtype=key.dtype, device=key.device)
        dv = torch.empty(value_full.shape, dtype=value.dtype, device=value.device)
        hooks = ctx.hooks
        with on_device(query.device):
            bwd.attention_backward(
                query.transpose(1, 2), key_full.transpose(1, 2), value_full.transpose(1, 2),
                out.transpose(1, 2), lse, dout.contiguous().transpose(1, 2), dq.transpose(1, 2),
                dk.transpose(1, 2), dv.transpose(1, 2), causal=False,
                softmax_scale=hooks["softmax_scale"],
                dlse=None if dlse is None else dlse.contiguous(), window_left=-1,
                window_right=-1, score_mod=hooks["score_mod"],
                score_mod_grad=hooks["score_mod_grad"], mask_mod=hooks["mask_mod"],
                mod_args=hooks["mod_args"], arch=arch_of(query.device))
        if key.shape[0] != batch:
            dk, dv = dk.sum(0, keepdim=True), dv.sum(0, keepdim=True)
        return dq, dk, dv, None, None


def backward_hooks(translate_mods, score_mod, block_mask, block_lists, *, batch: int,
                   num_q_heads: int, seqlen_q: int, seqlen_k: int, softmax_scale: float,
                   device) -> dict:
    """The backward kernels' hooks for a call (translate_mods: flex.translate's, with the
    derivative). Without a BlockMask the user's functions are the hooks as they are."""
    mask_mod = None if block_mask is None else block_mask.mask_mod
    hooks = translate_mods(score_mod, mask_mod, device=device, with_grad=True)
    mod_args = tuple(hooks.mod_args)
    mask_hook = hooks.mask_mod
    if block_lists is not None:
        kinds = flex_backward.block_kinds(block_lists, batch=batch, num_q_heads=num_q_heads,
                                          seqlen_q=seqlen_q, seqlen_k=seqlen_k)
        mask_hook = flex_backward.block_mask_hook(hooks.mask_mod, len(mod_args))
        mod_args = mod_args + flex_backward.block_mask_args(kinds, block_lists)
    return dict(softmax_scale=softmax_scale, score_mod=hooks.score_mod,
                score_mod_grad=hooks.score_mod_grad, mask_mod=mask_hook, mod_args=mod_args)
