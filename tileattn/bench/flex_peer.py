"""FlexAttention as a peer: torch's compiled flex_attention, and FLOPs from a mask's exact count
of visible (query, key) pairs (sliding windows, documents, prefixes: only the visible work).

The grids that time masks (benchmarks/serving.py, benchmarks/flex_mods.py) count FLOPs the same
way: 4 * head_dim * heads * visible pairs, summed over the batch (a causal N x N mask has
N(N+1)/2 pairs, within 1/N of prefill.flops' N^2/2 convention).
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def compiled_flex_attention():
    """torch.compile(flex_attention, dynamic=False), compiled once per shape and function."""
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention
    # The default recompile limit of 8 silently falls back to an unfused path and gives
    # nonsense numbers (../shared/BENCHMARKS.md).
    torch._dynamo.config.cache_size_limit = 1000
    return torch.compile(flex_attention, dynamic=False)


def visible_pairs(mask_mod, batch: int, seqlen_q: int, seqlen_k: int, device="cpu",
                  rows_per_chunk: int = 2048) -> int:
    """Visible (query, key) pairs of mask_mod(b, h, q_idx, kv_idx) over the batch, with every
    head sharing head 0's mask. The function must broadcast over index tensors (as FlexAttention
    functions do); it is evaluated on chunks of rows_per_chunk query rows."""
    total = 0
    keys = torch.arange(seqlen_k, device=device)[None, :]
    head = torch.tensor(0, device=device)
    for b in range(batch):
        index = torch.tensor(b, device=device)
        for start in range(0, seqlen_q, rows_per_chunk):
            rows = torch.arange(start, min(start + rows_per_chunk, seqlen_q), device=device)
            total += int(mask_mod(index, head, rows[:, None], keys).sum())
    return total


def mask_flops(mask_mod, batch: int, heads: int, head_dim: int, seqlen_q: int, seqlen_k: int,
               device="cpu") -> float:
    """Forward FLOPs of attention under mask_mod: QK^T and PV on the visible pairs only."""
    return 4.0 * head_dim * heads * visible_pairs(mask_mod, batch, seqlen_q, seqlen_k, device)


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding_window(window: int):
    """Causal with the `window` keys before the query (and the query's own): tileattn's
    window_size=(window, 0) with causal=True."""
    def sliding_window_causal(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= window)
    return sliding_window_causal


def softcap(cap: float):
    """The score_mod of tileattn's softcap: scores s become cap * tanh(s / cap)."""
    def softcap_score(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)
    return softcap_score


def document_causal(document_ids: torch.Tensor):
    """Causal within documents of a packed sequence: document_ids int [batch, seqlen]."""
    def document_causal_mask(b, h, q_idx, kv_idx):
        return (document_ids[b, q_idx] == document_ids[b, kv_idx]) & (q_idx >= kv_idx)
    return document_causal_mask
