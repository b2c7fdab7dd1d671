"""fp64 reference implementations: the yardstick for tests, benchmarks and the accuracy table.

They also serve CPU tensors when the Triton interpreter is off (slow but exact).
"""

from __future__ import annotations

import math

import torch


def _descaled(x: torch.Tensor, descale: torch.Tensor | None) -> torch.Tensor:
    """x [B, S, H, D] upcast to fp64, times its descale (scalar or [B, H])."""
    x = x.to(torch.float32).to(torch.float64)
    if descale is None:
        return x
    descale = descale.to(device=x.device, dtype=torch.float64)
    if descale.dim() == 2:
        descale = descale[:, None, :, None]
    return x * descale


def attention_reference(q, k, v, *, causal=False, softmax_scale=None,
                        q_descale=None, k_descale=None, v_descale=None, window_size=(-1, -1),
                        softcap=0.0, alibi_slopes=None):
    """Exact attention in fp64. Returns (out [B, Sq, Hq, Dv], lse [B, Hq, Sq]), both fp64.

    Causal masking is bottom-right aligned: query i sees keys j <= i + Sk - Sq. Rows that see
    no key output 0 with lse = -inf. FlashAttention's conventions for the rest: window_size
    (left, right) keeps keys i + Sk - Sq - left <= j <= i + Sk - Sq + right (-1: unbounded);
    softcap > 0 maps scores s -> softcap * tanh(s / softcap); then alibi_slopes ([Hq] or
    [B, Hq]) subtract slope * |i + Sk - Sq - j|.
    """
    q, k, v = _descaled(q, q_descale), _descaled(k, k_descale), _descaled(v, v_descale)
    seqlen_q, num_q_heads, head_dim = q.shape[1], q.shape[2], q.shape[3]
    seqlen_k, num_kv_heads = k.shape[1], k.shape[2]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    group = num_q_heads // num_kv_heads
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    # Queries in chunks so that a 32k-context check needs ~1 GB of fp64 scores, not 100s.
    chunk = max(1, (1 << 27) // max(1, seqlen_k * num_q_heads * q.shape[0]))
    outs, lses = [], []
    for start in range(0, seqlen_q, chunk):
        rows = torch.arange(start, min(start + chunk, seqlen_q), device=q.device)
        scores = torch.einsum("bqhd,bkhd->bhqk", q[:, rows], k) * softmax_scale
        if softcap > 0:
            scores = softcap * torch.tanh(scores / softcap)
        cols = torch.arange(seqlen_k, device=q.device)
        distance = rows[:, None] + (seqlen_k - seqlen_q) - cols[None, :]   # [q, k]
        if alibi_slopes is not None:
            slopes = alibi_slopes.to(device=q.device, dtype=torch.float64)
            slopes = slopes[None, :] if slopes.dim() == 1 else slopes        # [B or 1, Hq]
            scores = scores - slopes[:, :, None, None] * distance.abs()
        left, right = window_size
        hidden = torch.zeros_like(distance, dtype=torch.bool)
        if causal:
            hidden |= distance < 0
        if right >= 0:
            hidden |= distance < -right
        if left >= 0:
            hidden |= distance > left
        scores = scores.masked_fill(hidden, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        probs = torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
        outs.append(torch.einsum("bhqk,bkhd->bqhd", probs, v))
        lses.append(lse)
    return torch.cat(outs, dim=1), torch.cat(lses, dim=2)


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


def paged_attention_reference(q, k_cache, v_cache, block_table, seq_lens_k, cu_seqlens_q, *,
                              q_descale=None, k_descale=None, v_descale=None, **options):
    """attention_reference per sequence of a paged batch (FlashAttention's varlen layout).

    q [total_q, Hq, D] with sequence b's queries at rows cu_seqlens_q[b] ..< cu_seqlens_q[b+1];
    k_cache / v_cache [num_pages, page_size, Hkv, D / Dv], sequence b's keys the first
    seq_lens_k[b] rows of its block_table row's pages, in order; descales [] or [B, heads].
    options go to attention_reference (causal, softmax_scale, window_size, softcap,
    alibi_slopes, where [B, Hq] slopes are taken per sequence). Returns (out [total_q, Hq, Dv],
    lse [Hq, total_q]), both fp64.
    """
    total_q, num_q_heads, _ = q.shape
    page_size = k_cache.shape[1]
    out = torch.zeros(total_q, num_q_heads, v_cache.shape[3], dtype=torch.float64, device=q.device)
    lse = torch.empty(num_q_heads, total_q, dtype=torch.float64, device=q.device)

    def of_sequence(x, b):
        return x if x is None or x.dim() < 2 else x[b:b + 1]

    for b, seq_len in enumerate(seq_lens_k.tolist()):
        start, end = (int(x) for x in cu_seqlens_q[b:b + 2])
        if end == start:
            continue
        keys = torch.arange(seq_len, device=q.device)
        pages = block_table[b].long()[keys // page_size]
        k = k_cache[pages, keys % page_size][None]
        v = v_cache[pages, keys % page_size][None]
        sequence_options = dict(options)
        if options.get("alibi_slopes") is not None:
            sequence_options["alibi_slopes"] = of_sequence(options["alibi_slopes"], b)
        seq_out, seq_lse = attention_reference(
            q[None, start:end], k, v, q_descale=of_sequence(q_descale, b),
            k_descale=of_sequence(k_descale, b), v_descale=of_sequence(v_descale, b),
            **sequence_options)
        out[start:end] = seq_out[0]
        lse[:, start:end] = seq_lse[0]
    return out, lse
