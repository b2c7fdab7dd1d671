"""The per-block attention backward that the ring's backward pass calls once per step.

Contract (FlashAttention's, which composes over key blocks): for one block of keys,

    block_backward(dout, q, k, v, out, lse, *, causal, softmax_scale) -> (dq, dk, dv)

    dout, q [B, Sq, Hq, D(v)], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv], in the inputs' dtype;
    out [B, Sq, Hq, Dv] and lse fp32 [B, Hq, Sq] are the *merged* output and log-sum-exp over
    all keys of the sequence, not this block's: with P = exp(scale * q k^T - lse) (masked,
    bottom-right aligned when causal) and Δ = rowsum(dout * out),
        dv = P^T dout,   dS = P * (dout v^T - Δ),   dq = scale * dS k,   dk = scale * dS^T q,
    summed over the query heads of each KV head (GQA). The block's gradients are its terms of
    the full gradient; the ring adds them up. Returns floating tensors of q's, k's, v's shapes
    (any floating dtype: the ring accumulates in fp32).

block_backward runs tileattn's backward kernels (kernels/attention/bwd.py) with the merged
out and lse; _reference_block_backward is the contract's formulas in fp64 torch, the tests'
yardstick for the composition.
"""

from __future__ import annotations

import math

import torch


def block_backward(dout, q, k, v, out, lse, *, causal: bool, softmax_scale: float):
    """The per-block backward primitive (module docstring), on tileattn's backward kernels."""
    from ..arch import arch_of
    from ..kernels.attention import bwd
    from ..kernels.runtime import on_device
    dq, dk, dv = (torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v))
    if q.numel() == 0 or k.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    with on_device(q.device):
        bwd.attention_backward(q, k, v, out.to(q.dtype), lse.contiguous(),
                               dout.to(q.dtype), dq, dk, dv, causal=causal,
                               softmax_scale=softmax_scale, window_left=-1, window_right=-1,
                               arch=arch_of(q.device))
    return dq, dk, dv


def _reference_block_backward(dout, q, k, v, out, lse, *, causal: bool, softmax_scale: float):
    """REFERENCE STAND-IN for the backward kernel: the contract's formulas in fp64 torch.
    Returns fp32 (dq, dk, dv)."""
    dout, q, k, v, out = (x.to(torch.float64) for x in (dout, q, k, v, out))
    lse = lse.to(torch.float64)
    seqlen_q, num_q_heads = q.shape[1], q.shape[2]
    seqlen_k, num_kv_heads = k.shape[1], k.shape[2]
    group = num_q_heads // num_kv_heads
    k_per_q_head = k.repeat_interleave(group, dim=2)
    v_per_q_head = v.repeat_interleave(group, dim=2)

    scores = torch.einsum("bqhd,bkhd->bhqk", q, k_per_q_head) * softmax_scale
    if causal:
        rows = torch.arange(seqlen_q, device=q.device)[:, None]
        cols = torch.arange(seqlen_k, device=q.device)[None, :]
        scores = scores.masked_fill(cols > rows + (seqlen_k - seqlen_q), -math.inf)
    # A row that sees no key anywhere has lse -inf and P 0 (never NaN).
    probs = torch.exp(scores - torch.where(torch.isneginf(lse), 0.0, lse)[..., None])
    probs = probs.masked_fill(torch.isneginf(scores), 0.0)

    dv = torch.einsum("bhqk,bqhd->bkhd", probs, dout)
    dprobs = torch.einsum("bqhd,bkhd->bhqk", dout, v_per_q_head)
    delta = (dout * out).sum(dim=-1).transpose(1, 2)  # [B, Hq, Sq]
    dscores = probs * (dprobs - delta[..., None]) * softmax_scale
    dq = torch.einsum("bhqk,bkhd->bqhd", dscores, k_per_q_head)
    dk = torch.einsum("bhqk,bqhd->bkhd", dscores, q)

    def per_kv_head(x):  # [B, Sk, Hq, D] -> [B, Sk, Hkv, D], summing each KV head's query heads
        return x.unflatten(2, (num_kv_heads, group)).sum(dim=3)
    return dq.float(), per_kv_head(dk).float(), per_kv_head(dv).float()
