"""An fp64 stand-in for the forward kernel entry point tileattn.flex_attention calls, for tests
only: reference_attention_with_mods has the signature and the contract of
tileattn.ops.flex.attention_with_mods (see tileattn/flex/api.py), so the tests can
check everything between the user's functions and the kernel — translation, block lists,
argument plumbing — before the kernel exists, and later hold the kernel to the same contract.

Hooks are run by the Triton interpreter over the whole score grid (flex_hook_runner); the
attention itself is fp64 torch.
"""

from __future__ import annotations

import torch

from .flex_hook_runner import run_mask_hook, run_score_hook


def dense_blocks(num_blocks: torch.Tensor, indices: torch.Tensor, num_columns: int):
    """bool [..., rows, num_columns]: True where a row's first num_blocks indices list the
    column."""
    width = indices.shape[-1]
    listed = torch.arange(width, device=indices.device) < num_blocks[..., None]
    dense = torch.zeros(*indices.shape[:-1], num_columns + 1, dtype=torch.bool,
                        device=indices.device)
    dense.scatter_(-1, torch.where(listed, indices.long(), num_columns), True)
    return dense[..., :num_columns]


def visible(mask_mod, mod_args, block_lists, batch, heads, seqlen_q, seqlen_k, device):
    """bool [B, H, Sq, Sk]: what the kernel may attend to. Without block lists every key,
    filtered by mask_mod if any; with them, keys of full blocks, and keys of partial blocks
    that mask_mod keeps."""
    keep = torch.ones(batch, heads, seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if mask_mod is not None:
        keep = run_mask_hook(mask_mod, mod_args, batch, heads, seqlen_q, seqlen_k, device)
    if block_lists is None:
        return keep
    q_block, kv_block = block_lists.q_block_size, block_lists.kv_block_size
    num_kv_blocks = -(-seqlen_k // kv_block)

    def elements(num_blocks, indices):
        blocks = dense_blocks(num_blocks, indices, num_kv_blocks)
        blocks = blocks.repeat_interleave(q_block, dim=2).repeat_interleave(kv_block, dim=3)
        return blocks[:, :, :seqlen_q, :seqlen_k]
    partial = elements(block_lists.kv_num_blocks, block_lists.kv_indices)
    full = elements(block_lists.full_kv_num_blocks, block_lists.full_kv_indices)
    return full | (partial & keep)


def _upcast(x, descale):
    x = x.to(torch.float32).to(torch.float64)
    if descale is None:
        return x
    descale = descale.to(torch.float64)
    return x * (descale[:, None, :, None] if descale.dim() == 2 else descale)


def reference_attention_with_mods(q, k, v, out, lse, *, softmax_scale, score_mod, mask_mod,
                                  mod_args, block_mask_tensors, q_descale, k_descale,
                                  v_descale, score_linear=False, mask_uses=None):
    """Writes out [B, Sq, Hq, Dv] (and lse [B, Hq, Sq], natural log) like the kernel: scores
    q·kᵀ·scale in fp32 through score_mod, masked by the block lists and mask_mod, softmax in
    fp64; rows seeing no key give 0 and lse -inf. score_linear and mask_uses (how the Hopper
    kernel adds the score_mod and may read the mask_mod) change nothing here."""
    batch, seqlen_q, num_q_heads, head_dim = q.shape
    seqlen_k, num_kv_heads = k.shape[1], k.shape[2]
    assert out.shape == (batch, seqlen_q, num_q_heads, v.shape[3]) and isinstance(mod_args, tuple)
    assert lse is None or (lse.shape == (batch, num_q_heads, seqlen_q)
                           and lse.dtype == torch.float32 and lse.is_contiguous())
    assert isinstance(softmax_scale, float)
    group = num_q_heads // num_kv_heads
    q64 = _upcast(q, q_descale)
    k64 = _upcast(k, k_descale).repeat_interleave(group, dim=2)
    v64 = _upcast(v, v_descale).repeat_interleave(group, dim=2)
    scores = (torch.einsum("bqhd,bkhd->bhqk", q64, k64) * softmax_scale).to(torch.float32)
    if score_mod is not None:
        scores = run_score_hook(score_mod, mod_args, scores)
    scores = scores.to(torch.float64).masked_fill(
        ~visible(mask_mod, mod_args, block_mask_tensors, batch, num_q_heads, seqlen_q, seqlen_k,
                 q.device), float("-inf"))
    row_lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - torch.where(torch.isinf(row_lse), 0.0, row_lse)[..., None])
    out.copy_(torch.einsum("bhqk,bkhd->bqhd", probs, v64))
    if lse is not None:
        lse.copy_(row_lse)
