"""fp64 reference implementations: the yardstick for tests, benchmarks and the accuracy table.

Plain torch in float64: a user without a GPU or the interpreter can call them directly.
"""

from __future__ import annotations

import math

import torch

from .kernels.attention.configs import DESCALE_BLOCK_ROWS


def _descaled(x: torch.Tensor, descale: torch.Tensor | None) -> torch.Tensor:
    """x [B, S, H, D] upcast to fp64 (fp64 inputs kept, so autograd reaches them exactly),
    times its descale (scalar, [B, H], or [B, H, ceil(S / 128)]: one per 128-row block)."""
    if x.dtype != torch.float64:
        x = x.to(torch.float32).to(torch.float64)
    if descale is None:
        return x
    descale = descale.to(device=x.device, dtype=torch.float64)
    if descale.dim() == 2:
        descale = descale[:, None, :, None]
    elif descale.dim() == 3:
        rows = torch.arange(x.shape[1], device=x.device) // DESCALE_BLOCK_ROWS
        descale = descale[:, :, rows].permute(0, 2, 1)[..., None]
    return x * descale


def attention_reference(q, k, v, *, causal=False, softmax_scale=None, q_descale=None,
                        k_descale=None, v_descale=None, window_size=(-1, -1), softcap=0.0,
                        alibi_slopes=None):
    """Exact attention in fp64 (differentiable: every step is a torch op). Returns
    (out [B, Sq, Hq, Dv], lse [B, Hq, Sq]), both fp64.

    Masks are bottom-right aligned: query i sits at position p = i + Sk - Sq and sees keys
    p - left <= j <= p + right for window_size = (left, right) (-1: unbounded); causal sets
    right = 0. softcap > 0 maps scores s to softcap * tanh(s / softcap), then ALiBi adds
    -slope * |p - j| (alibi_slopes [Hq] or [B, Hq]). Rows that see no key output 0 with
    lse = -inf.
    """
    q, k, v = _descaled(q, q_descale), _descaled(k, k_descale), _descaled(v, v_descale)
    batch, seqlen_q, num_q_heads, head_dim = q.shape
    seqlen_k, num_kv_heads = k.shape[1], k.shape[2]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    group = num_q_heads // num_kv_heads
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    left, right = window_size
    if causal:
        right = 0
    slopes = None
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(device=q.device, dtype=torch.float64)
        slopes = (slopes[None, :] if slopes.dim() == 1 else slopes).expand(batch, num_q_heads)
    cols = torch.arange(seqlen_k, device=q.device)
    # Queries in chunks so that a 32k-context check needs ~1 GB of fp64 scores, not 100s.
    chunk = max(1, (1 << 27) // max(1, seqlen_k * num_q_heads * batch))
    outs, lses = [], []
    for start in range(0, seqlen_q, chunk):
        rows = torch.arange(start, min(start + chunk, seqlen_q), device=q.device)
        scores = torch.einsum("bqhd,bkhd->bhqk", q[:, rows], k) * softmax_scale
        if softcap > 0:
            scores = softcap * torch.tanh(scores / softcap)
        position = rows[:, None] + (seqlen_k - seqlen_q)          # [rows, 1]
        if slopes is not None:
            distance = (position - cols[None, :]).abs().to(torch.float64)
            scores = scores - slopes[:, :, None, None] * distance
        hidden = torch.zeros(len(rows), seqlen_k, dtype=torch.bool, device=q.device)
        if right >= 0:
            hidden |= cols[None, :] > position + right
        if left >= 0:
            hidden |= cols[None, :] < position - left
        scores = scores.masked_fill(hidden, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        probs = torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
        outs.append(torch.einsum("bhqk,bkhd->bqhd", probs, v))
        lses.append(lse)
    if not outs:
        return (q.new_zeros((batch, 0, num_q_heads, v.shape[3])),
                q.new_zeros((batch, num_q_heads, 0)))
    return torch.cat(outs, dim=1), torch.cat(lses, dim=2)


def paged_to_packed(cache, block_table, cu_seqlens_k):
    """A paged cache [num_pages, page_size, H, D] as the packed [total_k, H, D] it stands for:
    sequence b's keys are the first cu_seqlens_k[b+1] - cu_seqlens_k[b] rows of its pages."""
    page_size = cache.shape[1]
    parts = []
    for b in range(block_table.shape[0]):
        length = int(cu_seqlens_k[b + 1] - cu_seqlens_k[b])
        tokens = torch.arange(length, device=cache.device)
        pages = block_table[b].long()[tokens // page_size]
        parts.append(cache[pages, tokens % page_size])
    return torch.cat(parts) if parts else cache.new_empty((0, *cache.shape[2:]))


def paged_attention_reference(q, k_cache, v_cache, block_table, seq_lens_k, cu_seqlens_q,
                              **options):
    """attention_varlen_reference for a paged cache given key counts per sequence
    (seq_lens_k [B]) rather than their prefix sums."""
    cu_seqlens_k = torch.zeros(len(seq_lens_k) + 1, dtype=torch.int64)
    cu_seqlens_k[1:] = torch.as_tensor(seq_lens_k).cpu().long().cumsum(0)
    return attention_varlen_reference(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k,
                                      block_table=block_table, **options)


def attention_varlen_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, *, block_table=None,
                               causal=False, softmax_scale=None, q_descale=None,
                               k_descale=None, v_descale=None, window_size=(-1, -1),
                               softcap=0.0, alibi_slopes=None):
    """attention_reference over packed sequences: q [total_q, Hq, D], k/v [total_k, Hkv, D/Dv]
    (or paged caches with block_table), masks per sequence. Descales and ALiBi slopes may be
    per sequence ([B, H]). Returns (out [total_q, Hq, Dv], lse [Hq, total_q]), fp64."""
    if block_table is not None:
        k = paged_to_packed(k, block_table, cu_seqlens_k)
        v = paged_to_packed(v, block_table, cu_seqlens_k)
    outs, lses = [], []
    per_sequence = lambda x, b: x[b:b + 1] if x is not None and x.dim() == 2 else x
    for b in range(len(cu_seqlens_q) - 1):
        qs, qe, ks, ke = (int(x) for x in (cu_seqlens_q[b], cu_seqlens_q[b + 1],
                                           cu_seqlens_k[b], cu_seqlens_k[b + 1]))
        out, lse = attention_reference(
            q[None, qs:qe], k[None, ks:ke], v[None, ks:ke], causal=causal,
            softmax_scale=softmax_scale, q_descale=per_sequence(q_descale, b),
            k_descale=per_sequence(k_descale, b), v_descale=per_sequence(v_descale, b),
            window_size=window_size, softcap=softcap,
            alibi_slopes=per_sequence(alibi_slopes, b))
        outs.append(out[0])
        lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses, dim=1)


def mla_decode_reference(q, kv_cache, page_table, seq_lens, *, softmax_scale, kv_descale=None):
    """Exact MLA decode in fp64 over a paged latent cache. Returns (out [B, q_len, H, 512],
    lse [B, q_len, H]), both fp64.

    Keys are kv rows [:576] gathered through page_table, values their first 512 columns.
    Token j of q_len sees the first seq_len - q_len + 1 + j keys.
    """
    batch, q_len, num_heads, _ = q.shape
    page_size = kv_cache.shape[1]
    head_dim_v = 512
    out = torch.zeros(batch, q_len, num_heads, head_dim_v, dtype=torch.float64, device=q.device)
    lse = torch.empty(batch, q_len, num_heads, dtype=torch.float64, device=q.device)
    scale = 1.0 if kv_descale is None else float(kv_descale)
    for b in range(batch):
        seq_len = int(seq_lens[b])
        tokens = torch.arange(seq_len, device=q.device)
        pages = page_table[b].long()[tokens // page_size]
        kv = kv_cache[pages, tokens % page_size].to(torch.float32).to(torch.float64) * scale
        qb = q[b].to(torch.float32).to(torch.float64)              # [q_len, H, 576]
        scores = torch.einsum("shd,kd->shk", qb, kv) * softmax_scale
        limits = seq_len - q_len + 1 + torch.arange(q_len, device=q.device)
        hidden = tokens[None, :] >= limits[:, None]                # [q_len, seq_len]
        scores = scores.masked_fill(hidden[:, None, :], float("-inf"))
        lse[b] = torch.logsumexp(scores, dim=-1)
        out[b] = torch.einsum("shk,kd->shd", torch.exp(scores - lse[b][..., None]), kv[:, :head_dim_v])
    return out, lse
