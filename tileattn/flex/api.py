"""tileattn.flex_attention: torch's FlexAttention interface on tileattn's kernels.

The kernel entry point it calls (the contract; tests/flex_reference.py is an fp64 model of it):

    tileattn.kernels.attention_fwd.attention_with_mods(
        q, k, v, out, lse, *, softmax_scale, score_mod, mask_mod, mod_args,
        block_mask_tensors, q_descale, k_descale, v_descale) -> None

    q     [B, Sq, Hq, D]   fp16 / bf16 / e4m3 / e5m2; flex's [B, H, S, D] transposed, so any
                           strides with the last dim contiguous
    k     [B, Sk, Hkv, D]  likewise; batch stride 0 when one K/V serves every sequence
    v     [B, Sk, Hkv, Dv] likewise (an FP8 V layout the chip needs is the entry point's job,
                           as attention() does it)
    out   [B, Sq, Hq, Dv]  to write in full: bf16 for FP8 inputs, else q's dtype (a transposed
                           view of the contiguous [B, Hq, Sq, Dv] tensor returned to the user)
    lse   None, or float32 [B, Hq, Sq] contiguous: natural-log logsumexp of the visible scores
    softmax_scale        Python float, any finite value
    score_mod, mask_mod  @triton.jit hooks with the signatures of mods.md, or None
    mod_args             tuple of tensors on q's device (maybe empty), passed to every hook
    block_mask_tensors   block_mask.BlockMaskTensors, or None: visit every key block, all of
                         them partial (MASK_MOD, if set, applies everywhere)
    q/k/v_descale        FP8: float32 [] or [B, heads] tensors (never None); else None

    Per (batch b, query head h, query tile inside query block m = q_idx // q_block_size):
    s = q·kᵀ · softmax_scale (descales applied); s = SCORE_MOD(s, b, h, q_idx, kv_idx, q_shift,
    mod_args) on every visited key; keys of the full_kv blocks are visible, keys of the kv
    (partial) blocks where MASK_MOD is true, keys past Sk never; softmax over the visible keys.
    A row that sees no key writes out 0 and lse -inf. No built-in causal or window mask: a
    BlockMask is literal (top-left aligned when Sq != Sk). Tiles must divide the mask blocks:
    BLOCK_M | q_block_size, BLOCK_N | kv_block_size (block_mask.largest_tile picks them).
"""

from __future__ import annotations

import inspect
import math

import torch

from ..api import (INPUT_DTYPES, SUPPORTED_HEAD_DIMS, _unit_descale, check_descale,
                   check_no_grad, check_same_device, check_tensor)
from ..arch import FP8_DTYPES
from ..kernels import attention_fwd, interpreter_active
from ..kernels.cross_compile import on_device
from .block_mask import block_mask_tensors
from .translate import translate_mods


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None,
                   enable_gqa=False, return_lse=False, *, q_descale=None, k_descale=None,
                   v_descale=None):
    """Attention with a user score_mod and a BlockMask, as
    torch.nn.attention.flex_attention.flex_attention (same arguments, same layout).

    query [B, Hq, Sq, D], key [B or 1, Hkv, Sk, D], value [B or 1, Hkv, Sk, Dv]; fp16, bf16,
    float8_e4m3fn or float8_e5m2 (FP8: q_descale/k_descale/v_descale float32 [] or [B, heads]
    as tileattn.attention takes them); D and Dv in {64, 96, 128, 192, 256}. Hkv < Hq only
    with enable_gqa=True (Hq a multiple of Hkv). score_mod(score, b, h, q_idx, kv_idx) and
    the block mask's mask_mod(b, h, q_idx, kv_idx) are translated into kernel code
    (tileattn/flex/translate.py: the ops they may use, and the errors for others).
    scale defaults to 1/sqrt(D).

    Returns out [B, Hq, Sq, Dv] (bf16 for FP8 inputs, else the input dtype), and with
    return_lse=True also lse float32 [B, Hq, Sq], natural log. Rows that see no key give 0
    and lse -inf, as torch's flex_attention does.
    """
    _check_inputs(query, key, value, score_mod, block_mask, scale, enable_gqa, return_lse,
                  q_descale, k_descale, v_descale)
    batch, num_q_heads, seqlen_q, head_dim = query.shape
    seqlen_k = key.shape[2]
    device = query.device
    if device.type == "cpu" and not interpreter_active():
        raise ValueError("tileattn.flex_attention runs its Triton kernel: query must be on a GPU "
                         "(or set TRITON_INTERPRET=1 before importing tileattn to run it on the "
                         "CPU); torch.nn.attention.flex_attention runs on the CPU")
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    mask_mod = None if block_mask is None else block_mask.mask_mod
    hooks = translate_mods(score_mod, mask_mod, device=device)
    block_lists = None
    if block_mask is not None:
        block_lists = block_mask_tensors(block_mask, batch=batch, num_q_heads=num_q_heads,
                                         seqlen_q=seqlen_q, seqlen_k=seqlen_k, device=device)
    if key.shape[0] != batch:          # one K/V for every batch entry (torch allows it)
        key = key.expand(batch, *key.shape[1:])
        value = value.expand(batch, *value.shape[1:])
    is_fp8 = query.dtype in FP8_DTYPES
    if is_fp8:
        # As attention(): the kernel reads every descale; a missing one is 1.0.
        q_descale, k_descale, v_descale = (_unit_descale(device) if d is None else d
                                           for d in (q_descale, k_descale, v_descale))
    out_dtype = torch.bfloat16 if is_fp8 else query.dtype
    out = torch.empty((batch, num_q_heads, seqlen_q, value.shape[3]), dtype=out_dtype,
                      device=device)
    lse = (torch.empty((batch, num_q_heads, seqlen_q), dtype=torch.float32, device=device)
           if return_lse else None)
    attention_with_mods = getattr(attention_fwd, "attention_with_mods", None)
    if attention_with_mods is None:
        raise NotImplementedError("tileattn.flex_attention needs the forward kernel with hooks "
                                  "(tileattn.kernels.attention_fwd.attention_with_mods), which "
                                  "this build does not have yet")
    # The kernels take [B, S, H, D] with any strides: flex's [B, H, S, D], permuted.
    with on_device(device):
        attention_with_mods(
            query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
            out.transpose(1, 2), lse, softmax_scale=float(scale),
            score_mod=hooks.score_mod, mask_mod=hooks.mask_mod, mod_args=hooks.mod_args,
            block_mask_tensors=block_lists, q_descale=q_descale, k_descale=k_descale,
            v_descale=v_descale)
    return (out, lse) if return_lse else out


def _positional_arity(fn) -> int | None:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    return sum(1 for p in parameters if p.default is inspect.Parameter.empty
               and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def _check_inputs(query, key, value, score_mod, block_mask, scale, enable_gqa, return_lse,
                  q_descale, k_descale, v_descale) -> None:
    for name, x in (("query", query), ("key", key), ("value", value)):
        check_tensor(name, x, 4)
        if x.dtype not in INPUT_DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16, float8_e4m3fn or float8_e5m2, "
                            f"got {x.dtype}")
        if x.stride(3) != 1:
            raise ValueError(f"{name} must have a contiguous last dim (stride 1), got strides "
                             f"{x.stride()}")
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(f"query, key and value must share one dtype, got query {query.dtype}, "
                        f"key {key.dtype}, value {value.dtype}")
    for name, flag in (("enable_gqa", enable_gqa), ("return_lse", return_lse)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    check_no_grad("flex_attention", query=query, key=key, value=value, q_descale=q_descale,
                  k_descale=k_descale, v_descale=v_descale)
    batch, num_q_heads, seqlen_q, head_dim = query.shape
    key_batch, num_kv_heads, seqlen_k, _ = key.shape
    if value.shape[:3] != key.shape[:3]:
        raise ValueError(f"key and value must agree in batch, heads and seqlen, got key "
                         f"{tuple(key.shape)}, value {tuple(value.shape)}")
    if key.shape[3] != head_dim:
        raise ValueError(f"query and key must have the same head_dim, got query {head_dim}, "
                         f"key {key.shape[3]}")
    for name, dim in (("query/key head_dim", head_dim), ("value head_dim", value.shape[3])):
        if dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"{name} must be one of {SUPPORTED_HEAD_DIMS}, got {dim}")
    if num_q_heads != num_kv_heads and not enable_gqa:
        raise ValueError(f"query has {num_q_heads} heads and key/value {num_kv_heads}: set "
                         "enable_gqa=True for grouped-query attention")
    if num_q_heads % num_kv_heads != 0:
        raise ValueError(f"query's heads ({num_q_heads}) must be a multiple of key/value's "
                         f"({num_kv_heads}) for GQA")
    if key_batch != batch:
        mask_batch = None if block_mask is None else getattr(block_mask, "kv_num_blocks",
                                                             None)
        if key_batch != 1 or mask_batch is None or mask_batch.shape[0] != batch:
            raise ValueError(f"key/value batch ({key_batch}) differs from query's ({batch}): "
                             "allowed only for key/value batch 1 with a block_mask of the "
                             "query's batch, as torch's flex_attention")
    if score_mod is not None and (not callable(score_mod)
                                  or _positional_arity(score_mod) not in (None, 5)):
        raise TypeError("score_mod must be a function (score, batch, head, q_idx, kv_idx) -> "
                        f"score, got {score_mod!r}")
    if block_mask is not None:
        from torch.nn.attention.flex_attention import BlockMask, _sliced_mask_mod_error
        if not isinstance(block_mask, BlockMask):
            raise TypeError(f"block_mask must be a torch.nn.attention.flex_attention.BlockMask "
                            f"or None, got {type(block_mask).__name__}")
        if block_mask.mask_mod is _sliced_mask_mod_error:
            raise ValueError("block_mask was sliced, which drops its mask_mod: set "
                             "block_mask.mask_mod from the original BlockMask")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not math.isfinite(scale)):
        raise ValueError(f"scale must be a finite float or None, got {scale!r}")
    is_fp8 = query.dtype in FP8_DTYPES
    if not is_fp8 and any(d is not None for d in (q_descale, k_descale, v_descale)):
        raise ValueError("q_descale/k_descale/v_descale apply only to FP8 inputs, got them with "
                         f"{query.dtype}")
    check_descale("q_descale", q_descale, batch, num_q_heads)
    check_descale("k_descale", k_descale, batch, num_kv_heads)
    check_descale("v_descale", v_descale, batch, num_kv_heads)
    check_same_device(query=query, key=key, value=value, q_descale=q_descale,
                      k_descale=k_descale, v_descale=v_descale)
