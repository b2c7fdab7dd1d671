"""Autograd for the attention ops: the tileattn::attention_backward custom op (the backward
kernels of kernels/attention/bwd.py), its registration as the backward of tileattn::attention
and tileattn::attention_varlen, and the same autograd as Functions for eager calls (bottom).

FlashAttention's memory rule: the forward saves q, k, v, out and lse only (out and lse are the
forward's own outputs), and the backward recomputes P block by block. Its extra memory is
delta (4 bytes per query row and head), plus an fp32 copy of dq's shape where dQ is added by
reductions: only for non-deterministic calls that the fused Hopper kernel runs
(bwd.fused_applies), which beat the fixed-order dQ pass on the H100; everywhere else the
fixed-order pass runs, which beat the portable kernels' fp32 atomics.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .. import dispatch
from ..arch import arch_of
from ..kernels import mods
from ..kernels.attention import bwd
from ..kernels.runtime import on_device
from . import backward_cache, library


def backward_impl(dout: Tensor, dlse: Tensor | None, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                  lse: Tensor, cu_seqlens_q: Tensor | None, cu_seqlens_k: Tensor | None,
                  max_seqlen_q: int, max_seqlen_k: int, causal: bool, softmax_scale: float,
                  window_left: int, window_right: int, softcap: float,
                  alibi_slopes: Tensor | None, deterministic: bool
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """tileattn::attention_backward's implementation (eager autograd calls it directly).
    dlse None: lse had no gradient (the kernels then skip it)."""
    lse, dout = lse.contiguous(), dout.contiguous()
    dlse = None if dlse is None else dlse.contiguous()
    settings = dispatch.current()
    key = backward_cache.signature(
        dout, dlse, q, k, v, out, lse, causal=causal, softmax_scale=softmax_scale,
        window_left=window_left, window_right=window_right, softcap=softcap,
        alibi_slopes=alibi_slopes, deterministic=deterministic, settings=settings,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k)
    score_mod, score_mod_grad, mod_args = mods.builtin(softcap, alibi_slopes)
    replay = backward_cache.CALLS.get(key)
    if replay is not None:
        with on_device(q.device):
            return replay(dout, dlse, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, mod_args)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if q.numel() == 0 or k.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    varlen = {}
    if cu_seqlens_q is not None:
        varlen = dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                      max_seqlen_q=max_seqlen_q, max_seqlen_k=max(max_seqlen_k, 1))
    arch = arch_of(q.device)
    kernel = dispatch.backward_kernel(arch, settings)
    # dQ by the fused Hopper kernel's reductions where it runs (docs/design.md, "Backward");
    # elsewhere the fixed-order pass, which beat fp32 atomics at every point measured.
    deterministic = deterministic or not bwd.fused_applies(
        q, k, v, dout, lse, arch, kernel, is_varlen=cu_seqlens_q is not None,
        score_mod=score_mod, window_left=window_left,
        window_right=0 if causal else window_right)
    delta, dq_accum = bwd.backward_workspace(q, lse, deterministic)
    with on_device(q.device):
        launches = bwd.backward_launches(
            q, k, v, out, lse, dout, dq, dk, dv, delta, dq_accum, causal=causal, dlse=dlse,
            softmax_scale=softmax_scale, window_left=window_left,
            window_right=0 if causal else window_right, score_mod=score_mod,
            score_mod_grad=score_mod_grad, mod_args=mod_args, arch=arch,
            kernel=kernel, **varlen)
        for launch in launches:
            launch.run()
    if key is not None:
        call = dict(q=q, k=k, v=v, out=out, lse=lse, dout=dout, dlse=dlse, dq=dq, dk=dk, dv=dv,
                    delta=delta, dq_accum=dq_accum, cu_seqlens_q=cu_seqlens_q,
                    cu_seqlens_k=cu_seqlens_k, mod_args=mod_args)
        backward_cache.CALLS.put(key, backward_cache.make_replay(launches, call, deterministic))
    return dq, dk, dv


attention_backward = torch.library.custom_op("tileattn::attention_backward", backward_impl,
                                             mutates_args=())


@attention_backward.register_fake
def _attention_backward_fake(dout, dlse, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                             max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_left,
                             window_right, softcap, alibi_slopes, deterministic):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


# ---- registration -------------------------------------------------------------------------


def _save_dense(ctx, inputs, output):
    (q, k, v, causal, softmax_scale, window_left, window_right, softcap, alibi_slopes,
     _q_descale, _k_descale, _v_descale, _out_dtype, deterministic) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, alibi_slopes)
    ctx.options = (causal, softmax_scale, window_left, window_right, softcap, deterministic)
    ctx.out_dtype_differs = out.dtype != q.dtype


def _float_or_none(dlse):
    return None if dlse is None else dlse.float()


def _dense_backward(ctx, dout, dlse, backward=attention_backward):
    q, k, v, out, lse, alibi_slopes = ctx.saved_tensors
    causal, softmax_scale, window_left, window_right, softcap, deterministic = ctx.options
    if ctx.out_dtype_differs:   # out_dtype=float32 etc.: the kernels read out in q's dtype
        out = out.to(q.dtype)
    dq, dk, dv = backward(dout.to(q.dtype), _float_or_none(dlse), q, k, v, out, lse, None,
                                    None, 0, 0, causal, softmax_scale, window_left,
                                    window_right, softcap, alibi_slopes, deterministic)
    return (dq, dk, dv) + (None,) * 11


def _save_varlen(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
     window_left, window_right, softcap, alibi_slopes, _block_table, _q_descale, _k_descale,
     _v_descale, _out_dtype, deterministic) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes)
    ctx.options = (max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_left, window_right,
                   softcap, deterministic)
    ctx.out_dtype_differs = out.dtype != q.dtype


def _varlen_backward(ctx, dout, dlse, backward=attention_backward):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes = ctx.saved_tensors
    (max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_left, window_right, softcap,
     deterministic) = ctx.options
    if ctx.out_dtype_differs:
        out = out.to(q.dtype)
    dq, dk, dv = backward(dout.to(q.dtype), _float_or_none(dlse), q, k, v, out, lse,
                                    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    causal, softmax_scale, window_left, window_right, softcap,
                                    alibi_slopes, deterministic)
    return (dq, dk, dv) + (None,) * 16


torch.library.register_autograd("tileattn::attention", _dense_backward,
                                setup_context=_save_dense)
torch.library.register_autograd("tileattn::attention_varlen", _varlen_backward,
                                setup_context=_save_varlen)


# ---- eager autograd -------------------------------------------------------------------------
# Outside torch.compile, autograd runs the ops' implementations through these Functions: the
# same setup_context and backward as the registrations above, without the custom ops' Python
# dispatch, which cost more host time than the kernels take at short contexts
# (docs/design.md, "Backward").


def _eager_function(name: str, implementation, setup_context, backward) -> type:
    """An autograd.Function running an op's implementation with the op's registered
    setup_context and backward (the latter calling backward_impl, not the backward op)."""
    def forward(ctx, *inputs):
        # Detached, the tensors pass the forward's call cache (ops/attention.py), which takes
        # no tensor that requires grad; setup_context saves the inputs themselves.
        output = implementation(*(x.detach() if isinstance(x, torch.Tensor) else x
                                  for x in inputs))
        setup_context(ctx, inputs, output)
        # An unused lse's gradient stays None (no zeros made and read); out's is made if None.
        ctx.set_materialize_grads(False)
        return output

    def backward_eager(ctx, dout, dlse):
        if dout is None:
            dout = torch.zeros_like(ctx.saved_tensors[3])
        return backward(ctx, dout, dlse, backward_impl)
    # once_differentiable: a second derivative raises, as through the backward op (which has
    # no autograd), instead of coming out as zero.
    return type(name, (torch.autograd.Function,), dict(
        __doc__=f"{name}: the eager autograd of {implementation.__name__} (its op's arguments).",
        forward=staticmethod(forward),
        backward=staticmethod(once_differentiable(backward_eager))))


EagerAttention = _eager_function("EagerAttention", library.attention_impl, _save_dense,
                                 _dense_backward)
EagerAttentionVarlen = _eager_function("EagerAttentionVarlen", library.attention_varlen_impl,
                                       _save_varlen, _varlen_backward)

__all__ = ["EagerAttention", "EagerAttentionVarlen", "attention_backward", "library"]
