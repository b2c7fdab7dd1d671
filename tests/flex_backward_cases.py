"""flex_attention gradient checks shared by the CPU tests (tests/test_flex_backward.py) and the
GPU tests (tests/gpu/test_flex_gpu.py): named cases and a comparison with fp64 autograd
through the user's own functions (torch's flex_attention has no CPU backward to compare with).

Tolerances are conftest's, one row per dtype: TOLERANCES for the output, GRAD_TOLERANCES (the
attention backward's, measured against a same-dtype eager backward) for dq, dk, dv.
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import create_block_mask

import tileattn

from .conftest import GRAD_TOLERANCES, TOLERANCES
from .flex_functions import (alibi, causal, doc_ids_for, document, prefix_lm, relative_position,
                             sliding_window, softcap)
from .flex_reference import dense_blocks

NAMES = ["causal", "sliding_window", "document", "prefix_lm", "alibi", "softcap",
         "relative_position", "no_key_rows"]


def reference(query, key, value, score_mod, block_mask, scale=None):
    """(out, lse) by torch ops on the user's functions, in the inputs' dtype (fp64 in the
    checks): differentiable. The BlockMask is read literally: keys of full blocks, keys of
    partial blocks that mask_mod keeps, nothing else."""
    batch, heads, seqlen_q, head_dim = query.shape
    groups = heads // key.shape[1]
    key, value = (x.repeat_interleave(groups, dim=1).expand(batch, -1, -1, -1)
                  for x in (key, value))
    scores = query @ key.transpose(-1, -2) * (head_dim ** -0.5 if scale is None else scale)
    seqlen_k = key.shape[2]
    device = query.device
    b = torch.arange(batch, device=device)[:, None, None, None]
    h = torch.arange(heads, device=device)[None, :, None, None]
    q_idx = torch.arange(seqlen_q, device=device)[None, None, :, None]
    kv_idx = torch.arange(seqlen_k, device=device)[None, None, None, :]
    if score_mod is not None:
        scores = score_mod(scores, b, h, q_idx, kv_idx)
    if block_mask is not None:
        q_block, kv_block = block_mask.BLOCK_SIZE
        num_kv_blocks = -(-seqlen_k // kv_block)

        def elements(num_blocks, indices):
            blocks = dense_blocks(num_blocks, indices, num_kv_blocks)
            blocks = blocks.repeat_interleave(q_block, 2).repeat_interleave(kv_block, 3)
            return blocks[:, :, :seqlen_q, :seqlen_k]
        keep = block_mask.mask_mod(b, h, q_idx, kv_idx)
        visible = elements(block_mask.kv_num_blocks, block_mask.kv_indices) & keep
        if block_mask.full_kv_num_blocks is not None:
            visible = visible | elements(block_mask.full_kv_num_blocks,
                                         block_mask.full_kv_indices)
        scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probabilities = torch.exp(scores - torch.where(lse.isinf(), 0.0, lse)[..., None])
    return probabilities @ value, lse


def flex_case(name, dtype=torch.bfloat16, seqlen_q=70, seqlen_k=70, heads=2, kv_heads=2,
              kv_batch=2, block=16, head_dim=64, device="cpu"):
    """(inputs requiring grad, score_mod, block_mask) of a named case (NAMES). block: the
    BlockMask's BLOCK_SIZE (an int or (q, kv))."""
    gen = torch.Generator().manual_seed(len(name) + seqlen_q)
    batch = 2
    q = torch.randn(batch, heads, seqlen_q, head_dim, generator=gen)
    k = torch.randn(kv_batch, kv_heads, seqlen_k, head_dim, generator=gen)
    v = torch.randn(kv_batch, kv_heads, seqlen_k, head_dim, generator=gen)
    slopes = torch.rand(heads, generator=gen).to(device)
    table = torch.randn(heads, 2 * 8 + 1, generator=gen).to(device)
    longest = max(seqlen_q, seqlen_k)
    mods = {
        "causal": (causal, None), "sliding_window": (sliding_window(longest // 4), None),
        "document": (document(doc_ids_for(batch, longest, 3).to(device)), None),
        "prefix_lm": (prefix_lm(longest // 3), None), "alibi": (causal, alibi(slopes)),
        "softcap": (None, softcap(2.0)),
        "relative_position": (causal, relative_position(table, 8)),
        "no_key_rows": (lambda b, h, qi, ki: (qi >= longest // 2) & (ki <= qi), None),
    }
    mask_mod, score_mod = mods[name]
    block_mask = None if mask_mod is None else create_block_mask(
        mask_mod, batch, 1, seqlen_q, seqlen_k, device=device, BLOCK_SIZE=block)
    inputs = [x.to(device, dtype).requires_grad_()
              for x in (q * (3 if name == "softcap" else 1), k, v)]
    return inputs, score_mod, block_mask


def check_gradients(inputs, score_mod, block_mask, lse_grad=False, scale=None):
    """Output and gradients (through out, and lse if lse_grad) against fp64 autograd."""
    query, key, value = inputs
    out, lse = tileattn.flex_attention(query, key, value, score_mod=score_mod,
                                       block_mask=block_mask, scale=scale, return_lse=True,
                                       enable_gqa=query.shape[1] != key.shape[1])
    gen = torch.Generator().manual_seed(1)
    grad_out = torch.randn(out.shape, generator=gen).to(out.device, out.dtype)
    grad_lse = (torch.randn(lse.shape, generator=gen) if lse_grad
                else torch.zeros(lse.shape)).to(lse.device)
    finite = torch.isfinite(lse)
    grads = torch.autograd.grad((out, lse), inputs, (grad_out, grad_lse * finite))
    exact = [x.detach().double().requires_grad_() for x in inputs]
    want_out, want_lse = reference(*exact, score_mod, block_mask, scale)
    want = torch.autograd.grad((want_out, want_lse), exact,
                               (grad_out.double(), (grad_lse * finite).double()))
    dtype = query.dtype
    error = float((out.detach().double() - want_out).norm() / want_out.norm())
    assert error < TOLERANCES[dtype], ("out", error)
    for name, got, expected in zip("qkv", grads, want):
        assert got.shape == expected.shape and got.dtype == dtype, name
        error = float((got.double() - expected).norm() / expected.norm())
        assert error < GRAD_TOLERANCES[dtype], (name, error)


def check_compiled_step(inputs, score_mod, block_mask):
    """Under torch.compile the flex call is a graph break (ops/flex.py): a compiled step around
    it gives eager's loss and gradients exactly."""
    def step(q, k, v):
        out = tileattn.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                      enable_gqa=q.shape[1] != k.shape[1])
        weights = torch.linspace(-1, 1, out.shape[-1], device=out.device)
        return (out.float() * weights).sum()

    results = []
    for run in (step, torch.compile(step, backend="aot_eager")):
        leaves = [x.detach().clone().requires_grad_() for x in inputs]
        loss = run(*leaves)
        loss.backward()
        results.append([loss.detach(), *(x.grad for x in leaves)])
    for eager, compiled in zip(*results):
        assert torch.equal(eager, compiled)
