"""fp64 reference implementations: the yardstick for tests, benchmarks and the accuracy table.

They also serve CPU tensors when the Triton interpreter is off (slow but exact).
"""

from __future__ import annotations

import math

import torch


def _descaled(x: torch.Tensor, descale: torch.Tensor | None) -> torch.Tensor:
    """x [B, S, H, D] upcast to fp64, times its descale (scalar or [B, H]). An fp64 x is kept
    as it is, so that autograd's gradients stay fp64 (FP8 has no direct cast to fp64)."""
    if x.dtype != torch.float64:
        x = x.to(torch.float32).to(torch.float64)
    if descale is None:
        return x
    descale = descale.to(device=x.device, dtype=torch.float64)
    if descale.dim() == 2:
        descale = descale[:, None, :, None]
    return x * descale


def attention_reference(q, k, v, *, causal=False, softmax_scale=None,
                        q_descale=None, k_descale=None, v_descale=None,
                        window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None):
    """Exact attention in fp64. Returns (out [B, Sq, Hq, Dv], lse [B, Hq, Sq]), both fp64;
    differentiable (autograd gives fp64 gradients for fp64 inputs).

    Masks are bottom-right aligned: with p = i + Sk - Sq, query i sees keys
    p - window_left <= j <= p + window_right (-1: that side unbounded); causal sets
    window_right = 0. Scores s = q·k · softmax_scale become softcap · tanh(s / softcap) where
    softcap > 0, then s - slope · |p - j| with alibi_slopes (fp32 [Hq] or [B, Hq]). Rows that
    see no key output 0 with lse = -inf.
    """
    q, k, v = _descaled(q, q_descale), _descaled(k, k_descale), _descaled(v, v_descale)
    batch, seqlen_q, num_q_heads, head_dim = q.shape
    seqlen_k, num_kv_heads = k.shape[1], k.shape[2]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    if causal:
        window_right = 0
    group = num_q_heads // num_kv_heads
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    cols = torch.arange(seqlen_k, device=q.device)
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(device=q.device, dtype=torch.float64).expand(batch, num_q_heads)
    # Queries in chunks so that a 32k-context check needs ~1 GB of fp64 scores, not 100s.
    chunk = max(1, (1 << 27) // max(1, seqlen_k * num_q_heads * q.shape[0]))
    outs, lses = [], []
    for start in range(0, seqlen_q, chunk):
        rows = torch.arange(start, min(start + chunk, seqlen_q), device=q.device)
        aligned = rows[:, None] + (seqlen_k - seqlen_q)          # bottom-right aligned position
        scores = torch.einsum("bqhd,bkhd->bhqk", q[:, rows], k) * softmax_scale
        if softcap > 0:
            scores = softcap * torch.tanh(scores / softcap)
        if alibi_slopes is not None:
            distance = (aligned - cols[None, :]).abs().to(torch.float64)
            scores = scores - slopes[:, :, None, None] * distance
        hidden = torch.zeros(len(rows), seqlen_k, dtype=torch.bool, device=q.device)
        if window_left >= 0:
            hidden |= cols[None, :] < aligned - window_left
        if window_right >= 0:
            hidden |= cols[None, :] > aligned + window_right
        scores = scores.masked_fill(hidden, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        probs = torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
        outs.append(torch.einsum("bhqk,bkhd->bqhd", probs, v))
        lses.append(lse)
    return torch.cat(outs, dim=1), torch.cat(lses, dim=2)


def attention_varlen_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, *, alibi_slopes=None,
                               **options):
    """attention_reference over packed sequences: q [total_q, Hq, D], k/v [total_k, Hkv, D|Dv],
    cu_seqlens int32 [B + 1]; each sequence is masked and aligned on its own. alibi_slopes
    [Hq] or [B, Hq]. Returns (out [total_q, Hq, Dv], lse [Hq, total_q]), fp64, differentiable."""
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    outs, lses = [], []
    for b in range(len(starts_q) - 1):
        rows_q = slice(starts_q[b], starts_q[b + 1])
        rows_k = slice(starts_k[b], starts_k[b + 1])
        if rows_q.stop == rows_q.start:
            continue
        slopes = None if alibi_slopes is None else alibi_slopes.expand(len(starts_q) - 1, -1)[b]
        qb, kb, vb = q[rows_q][None], k[rows_k][None], v[rows_k][None]
        if rows_k.stop == rows_k.start:   # no keys: every row outputs 0, lse -inf
            outs.append(torch.zeros(qb.shape[1], q.shape[1], v.shape[2], dtype=torch.float64,
                                    device=q.device))
            lses.append(torch.full((q.shape[1], qb.shape[1]), float("-inf"), dtype=torch.float64,
                                   device=q.device))
            continue
        out, lse = attention_reference(qb, kb, vb, alibi_slopes=slopes, **options)
        outs.append(out[0])
        lses.append(lse[0])
    return torch.cat(outs, dim=0), torch.cat(lses, dim=1)


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
