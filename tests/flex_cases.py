"""flex_attention calls shared by the CPU tests (against the fp64 stand-in for the kernel and,
once it exists, the kernel in the interpreter) and the GPU tests: each case builds the inputs
and mods, and is compared with torch's eager flex_attention run in fp32 on the same values.

Shapes are small and odd (sequence lengths not multiples of the 16-wide mask blocks); masks
use BLOCK_SIZE 16 or (32, 16) so that calls span several partial and full blocks.
"""

from __future__ import annotations

import math

import torch
import torch.nn.attention.flex_attention as torch_flex
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask

from tileattn.arch import FP8_DTYPES

from .flex_functions import (alibi, causal, distance_bias, doc_ids_for, document,
                             linear_alibi, prefix_lm, relative_position, sliding_window, softcap)

HEAD_DIM = 64


def _inputs(batch, q_heads, kv_heads, seqlen_q, seqlen_k, dtype, device, seed, kv_batch=None):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    shapes = [(batch, q_heads, seqlen_q, HEAD_DIM)] + [(kv_batch or batch, kv_heads, seqlen_k,
                                                        HEAD_DIM)] * 2
    tensors = [torch.randn(shape, generator=gen).to(device) for shape in shapes]
    if dtype not in FP8_DTYPES:
        return [t.to(dtype) for t in tensors], {}
    quantized, descales = [], {}
    for name, t in zip(("q", "k", "v"), tensors):
        scale = torch.finfo(dtype).max / t.abs().amax()
        quantized.append((t * scale).to(dtype))
        descales[f"{name}_descale"] = (1.0 / scale).to(torch.float32)
    return quantized, descales


def _block_mask(mask_mod, batch, heads, seqlen_q, seqlen_k, device, block_size=16,
                separate_full_blocks=True):
    if separate_full_blocks:
        return create_block_mask(mask_mod, batch, heads, seqlen_q, seqlen_k, device=device,
                                 BLOCK_SIZE=block_size)
    return _partial_blocks_only(mask_mod, batch, heads, seqlen_q, seqlen_k, device, block_size)


def _partial_blocks_only(mask_mod, batch, heads, seqlen_q, seqlen_k, device, block_size):
    """A BlockMask listing every block with a visible pair as partial (no full-block lists):
    what create_block_mask(..., separate_full_blocks=False) builds on torch versions that
    have the flag (torch 2.11, the GPU machine's, has not)."""
    mask = torch_flex.create_mask(mask_mod, batch, heads, seqlen_q, seqlen_k, device=device)
    rows, cols = -(-seqlen_q // block_size), -(-seqlen_k // block_size)
    padded = torch.zeros(batch, heads, rows * block_size, cols * block_size, dtype=torch.bool,
                         device=device)
    padded[..., :seqlen_q, :seqlen_k] = mask
    seen = padded.view(batch, heads, rows, block_size, cols, block_size).any(5).any(3)
    counts = seen.sum(-1).to(torch.int32)
    # Visible blocks first, each group in ascending order (a stable sort of "hidden").
    indices = torch.sort((~seen).to(torch.int8), dim=-1, stable=True).indices.to(torch.int32)
    return torch_flex.BlockMask.from_kv_blocks(counts, indices, BLOCK_SIZE=block_size,
                                               mask_mod=mask_mod,
                                               seq_lengths=(seqlen_q, seqlen_k))


def case(name: str, dtype=torch.bfloat16, device="cpu", scale_up: int = 1):
    """The call `name`: dict of flex_attention arguments. scale_up multiplies the sequence
    lengths (the GPU tests use longer sequences)."""
    sq, sk = 45 * scale_up, 45 * scale_up
    kwargs = {}
    if name == "plain":
        tensors, descales = _inputs(2, 2, 2, 37 * scale_up, sk, dtype, device, 0)
    elif name == "causal":
        tensors, descales = _inputs(2, 2, 2, sq, sk, dtype, device, 1)
        kwargs["block_mask"] = _block_mask(causal, None, None, sq, sk, device)
    elif name == "sliding_window_softcap":
        tensors, descales = _inputs(1, 3, 3, sq, sk, dtype, device, 2)
        kwargs["block_mask"] = _block_mask(sliding_window(9 * scale_up), 1, 1, sq, sk, device)
        kwargs["score_mod"] = softcap(2.0)
    elif name == "document_alibi":
        tensors, descales = _inputs(2, 2, 2, sq, sk, dtype, device, 3)
        doc_ids = doc_ids_for(2, sk, 4).to(device)
        kwargs["block_mask"] = _block_mask(document(doc_ids), 2, 1, sq, sk, device,
                                           block_size=(32, 16))
        kwargs["score_mod"] = alibi(torch.rand(2, generator=torch.Generator().manual_seed(3))
                                    .to(device))
    elif name == "causal_linear_alibi":
        # Linear in q - kv (flex/linear.py): the kernels add it as row and column terms.
        tensors, descales = _inputs(2, 2, 2, 37 * scale_up, sk, dtype, device, 11)
        kwargs["block_mask"] = _block_mask(causal, None, None, 37 * scale_up, sk, device)
        slopes = torch.rand(2, generator=torch.Generator().manual_seed(11))
        kwargs["score_mod"] = linear_alibi(slopes.to(device))
    elif name == "distance_bias":
        # Linear too, with keys on both sides of each query and a bias per batch entry.
        tensors, descales = _inputs(2, 2, 2, sq, sk, dtype, device, 12)
        gen = torch.Generator().manual_seed(12)
        kwargs["score_mod"] = distance_bias(torch.rand(2, generator=gen).to(device),
                                            torch.randn(2, 2, generator=gen).to(device))
    elif name == "prefix_lm_relative_position":
        tensors, descales = _inputs(1, 2, 2, sq, sk, dtype, device, 4)
        kwargs["block_mask"] = _block_mask(prefix_lm(11 * scale_up), 1, 2, sq, sk, device)
        table = torch.randn(2, 21, generator=torch.Generator().manual_seed(4)).to(device)
        kwargs["score_mod"] = relative_position(table, 10)
    elif name == "gqa_causal":
        tensors, descales = _inputs(1, 4, 2, sq, sk, dtype, device, 5)
        kwargs["block_mask"] = _block_mask(causal, 1, 4, sq, sk, device)
        kwargs["enable_gqa"] = True
    elif name == "kv_batch_broadcast":
        tensors, descales = _inputs(2, 2, 2, sq, sk, dtype, device, 6, kv_batch=1)
        kwargs["block_mask"] = _block_mask(document(doc_ids_for(2, sk, 3).to(device)), 2, 1,
                                           sq, sk, device)
    elif name == "non_square_no_full_blocks":
        sq = 37 * scale_up
        tensors, descales = _inputs(2, 2, 2, sq, sk, dtype, device, 7)
        kwargs["block_mask"] = _block_mask(document(doc_ids_for(2, sk, 3).to(device)), 2, 1,
                                           sq, sk, device, separate_full_blocks=False)
    elif name == "rows_seeing_nothing":
        tensors, descales = _inputs(1, 2, 2, sq, sk, dtype, device, 8)
        kwargs["block_mask"] = _block_mask(lambda b, h, q, kv: (q >= kv) & (q >= 20), 1, 1, sq,
                                           sk, device)
    elif name == "block_lists_only":
        # Block lists that disagree with their mask_mod: full blocks show every key, partial
        # blocks what mask_mod (causal) keeps, unlisted blocks nothing — as torch.compile's
        # flex kernels read a BlockMask. torch's eager flex_attention ignores block lists, so
        # it gets a mask_mod that spells this out.
        tensors, descales = _inputs(2, 2, 2, sq, sk, dtype, device, 10)
        kwargs["block_mask"], kwargs["torch_block_mask"] = _block_pattern(2, sq, sk, device)
        kwargs["score_mod"] = softcap(3.0)
    elif name == "scale_and_lse":
        tensors, descales = _inputs(1, 2, 2, sq, sk, dtype, device, 9)
        kwargs["block_mask"] = _block_mask(causal, 1, 1, sq, sk, device)
        kwargs["scale"] = 0.3
        kwargs["score_mod"] = lambda score, b, h, q, kv: torch.where(q - kv > 5, score - 1.0,
                                                                     score)
    else:
        raise KeyError(name)
    query, key, value = tensors
    return {"query": query, "key": key, "value": value, **kwargs, **descales}


CASES = ["plain", "causal", "sliding_window_softcap", "document_alibi",
         "prefix_lm_relative_position", "gqa_causal", "kv_batch_broadcast",
         "non_square_no_full_blocks", "rows_seeing_nothing", "block_lists_only", "scale_and_lse",
         "causal_linear_alibi", "distance_bias"]


def _block_pattern(batch, seqlen_q, seqlen_k, device, block=16):
    """A random block-sparse BlockMask with a causal mask_mod (half of its listed blocks full,
    half partial; one query block sees nothing) and an equivalent mask for torch's eager
    flex_attention."""
    rows, columns = -(-seqlen_q // block), -(-seqlen_k // block)
    gen = torch.Generator().manual_seed(11)
    listed = torch.rand(batch, 1, rows, columns, generator=gen) < 0.6
    listed[:, :, 1] = False
    full = listed & (torch.rand(batch, 1, rows, columns, generator=gen) < 0.5)
    partial = listed & ~full

    def ordered(dense):
        counts = dense.sum(-1, dtype=torch.int32)
        order = torch.argsort(dense.to(torch.int32), dim=-1, descending=True, stable=True)
        return counts.to(device), order.to(torch.int32).to(device)
    lists = torch_flex.BlockMask.from_kv_blocks(*ordered(partial), *ordered(full),
                                                BLOCK_SIZE=block, mask_mod=causal,
                                                seq_lengths=(seqlen_q, seqlen_k))
    full, partial = full.to(device), partial.to(device)

    def spelled_out(b, h, q_idx, kv_idx):
        q_block, kv_block = q_idx // block, kv_idx // block
        return full[b, 0, q_block, kv_block] | (partial[b, 0, q_block, kv_block]
                                                & (q_idx >= kv_idx))
    return lists, _block_mask(spelled_out, batch, 1, seqlen_q, seqlen_k, device)


def torch_reference(arguments: dict):
    """torch's eager flex_attention in fp32 on the same (dequantized) values: (out, lse)."""
    def dequantized(name, descale):
        x = arguments[name].to(torch.float32)
        d = arguments.get(descale)
        if d is None:
            return x
        return x * (d[:, :, None, None] if d.dim() == 2 else d)
    # Plain eager evaluation: torch.compile's eager backend would recompile for every mod.
    previous = torch_flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG
    torch_flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    try:
        out, aux = torch_flex.flex_attention(
            dequantized("query", "q_descale"), dequantized("key", "k_descale"),
            dequantized("value", "v_descale"), score_mod=arguments.get("score_mod"),
            block_mask=arguments.get("torch_block_mask", arguments.get("block_mask")),
            scale=arguments.get("scale"),
            enable_gqa=arguments.get("enable_gqa", False), return_aux=AuxRequest(lse=True))
    finally:
        torch_flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = previous
    return out, aux.lse


def check_against_torch(tileattn_flex_attention, arguments: dict, tolerances, lse_tolerances):
    """Run tileattn's flex_attention on `arguments` and compare with torch_reference."""
    ours = {name: value for name, value in arguments.items() if name != "torch_block_mask"}
    out, lse = tileattn_flex_attention(**ours, return_lse=True)
    want_out, want_lse = torch_reference(arguments)
    dtype = arguments["query"].dtype
    assert out.shape == want_out.shape and lse.shape == want_lse.shape
    assert out.dtype == (torch.bfloat16 if dtype in FP8_DTYPES else dtype)
    assert lse.dtype == torch.float32
    error = (out.double() - want_out.double()).norm() / want_out.double().norm()
    assert error <= tolerances[dtype], f"relative L2 error {error:.3g}"
    dead = torch.isneginf(want_lse)
    assert torch.equal(torch.isneginf(lse), dead)
    assert (out[dead] == 0).all()
    lse_error = ((lse - want_lse).abs() / want_lse.abs().clamp(min=1))[~dead].max()
    assert lse_error <= lse_tolerances[dtype], f"lse error {lse_error:.3g}"
    assert math.isfinite(error)
