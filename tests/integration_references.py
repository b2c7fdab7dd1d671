"""fp64 stand-ins for tileattn features that the integrations use before tileattn has them.

The integration tests run twice where a feature is missing from this tree: with the real
tileattn function (skipped until the feature lands) and with these stand-ins monkeypatched in,
which compute the documented semantics exactly (tileattn/api.py, issue 18):
  window_size=(left, right): the query at aligned position p = i + Sk - Sq sees
      p - left <= j <= p + right (-1: unbounded side); causal adds j <= p.
  softcap=c > 0: s -> c * tanh(s / c) before masking.
  alibi_slopes [H] or [B, H]: s -> s - slope * |p - j|.
  attention_varlen: the same per sequence of cu_seqlens_q/cu_seqlens_k, lse [Hq, total_q].
So the stand-in runs check the integrations' glue (layouts, unpadding, the window's off-by-one)
against transformers' and torch's own attention now; the real runs check the kernels later.
"""

from __future__ import annotations

import functools
import math

import torch


def attention_reference(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1),
                        softcap=0.0, alibi_slopes=None, out_dtype=None, return_lse=False):
    """q [B, Sq, Hq, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv] -> out [B, Sq, Hq, Dv] in
    out_dtype (default q's), lse float32 [B, Hq, Sq]. Rows that see no key: out 0, lse -inf."""
    batch, seqlen_q, num_q_heads, head_dim = q.shape
    seqlen_k, num_kv_heads = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
    group = num_q_heads // num_kv_heads
    q64, k64, v64 = (x.to(torch.float64) for x in (q, k, v))
    k64 = k64.repeat_interleave(group, dim=2)
    v64 = v64.repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q64, k64) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    aligned = torch.arange(seqlen_q, device=q.device)[:, None] + (seqlen_k - seqlen_q)
    distance = aligned - torch.arange(seqlen_k, device=q.device)[None, :]   # p - j
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(torch.float64)
        slopes = slopes[None, :] if slopes.dim() == 1 else slopes
        scores = scores - slopes[:, :, None, None] * distance.abs()
    left, right = window_size
    visible = torch.ones_like(distance, dtype=torch.bool)
    if causal:
        visible &= distance >= 0
    if left >= 0:
        visible &= distance <= left
    if right >= 0:
        visible &= distance >= -right
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v64).to(out_dtype or q.dtype)
    return (out, lse.to(torch.float32)) if return_lse else out


def attention_varlen_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               *, causal=False, softmax_scale=None, window_size=(-1, -1),
                               softcap=0.0, alibi_slopes=None, block_table=None, out_dtype=None,
                               return_lse=False):
    """attention_reference per sequence of the packed q [total_q, Hq, D], k/v [total_k, ...]."""
    assert block_table is None, "the stand-in has no paged KV"
    options = dict(causal=causal, softmax_scale=softmax_scale, window_size=window_size,
                   softcap=softcap, alibi_slopes=alibi_slopes, out_dtype=out_dtype)
    assert cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    assert max(b - a for a, b in zip(starts_q, starts_q[1:])) <= max_seqlen_q
    assert max(b - a for a, b in zip(starts_k, starts_k[1:])) <= max_seqlen_k
    outs, lses = [], []
    for seq, (q0, q1, k0, k1) in enumerate(zip(starts_q, starts_q[1:], starts_k, starts_k[1:])):
        slopes = options.get("alibi_slopes")
        seq_options = dict(options, alibi_slopes=slopes if slopes is None or slopes.dim() == 1
                           else slopes[seq])
        out, lse = attention_reference(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1],
                                       return_lse=True, **seq_options)
        outs.append(out[0])
        lses.append(lse[0])
    out, lse = torch.cat(outs), torch.cat(lses, dim=1)
    return (out, lse) if return_lse else out


# One rounding unit of each half dtype: the slack of the FA3-style yardstick (the error with
# tileattn may be at most twice the error of the framework's own kernel in that dtype, plus this).
ROUNDING_UNIT = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def relative_error(x, reference) -> float:
    """Relative L2 error of x against reference, computed in float64."""
    x, reference = x.double(), reference.double()
    return float((x - reference).norm() / reference.norm())


def counting(function):
    """function with a .calls list recording each call's positional tensors, signature kept
    (the integrations probe keywords through inspect.signature)."""
    @functools.wraps(function)
    def counted(*args, **kwargs):
        counted.calls.append(args)
        return function(*args, **kwargs)
    counted.calls = []
    return counted
