"""flex_attention()'s argument rules, on the shared checks of tileattn/checks.py."""

from __future__ import annotations

import inspect
import math

from ..arch import FP8_DTYPES
from ..checks import INPUT_DTYPES, descale, no_grad, same_device, tensor
from ..checks import head_dim as check_head_dim
from .emit import POSITION_BOUND

def _positional_arity(fn) -> int | None:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    return sum(1 for p in parameters if p.default is inspect.Parameter.empty
               and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def flex_inputs(query, key, value, score_mod, block_mask, scale, enable_gqa, return_lse,
                  q_descale, k_descale, v_descale) -> None:
    for name, x in (("query", query), ("key", key), ("value", value)):
        tensor(name, x, 4)
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
    # 16-bit inputs are differentiable (ops/flex_backward.py); FP8 inputs and descales not.
    grad_free = dict(q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    if query.dtype in FP8_DTYPES:
        grad_free.update(query=query, key=key, value=value)
    no_grad("flex_attention", **grad_free)
    batch, num_q_heads, seqlen_q, head_dim = query.shape
    key_batch, num_kv_heads, seqlen_k, _ = key.shape
    longest = max(seqlen_q, seqlen_k)
    if longest > POSITION_BOUND:
        raise ValueError(f"query/key sequence length {longest} exceeds {POSITION_BOUND}: the "
                         "translated mods compute position arithmetic in float32, exact below it")
    if value.shape[:3] != key.shape[:3]:
        raise ValueError(f"key and value must agree in batch, heads and seqlen, got key "
                         f"{tuple(key.shape)}, value {tuple(value.shape)}")
    if key.shape[3] != head_dim:
        raise ValueError(f"query and key must have the same head_dim, got query {head_dim}, "
                         f"key {key.shape[3]}")
    check_head_dim("query/key head_dim", head_dim)
    check_head_dim("value head_dim", value.shape[3])
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
    descale("q_descale", q_descale, batch, num_q_heads)
    descale("k_descale", k_descale, batch, num_kv_heads)
    descale("v_descale", v_descale, batch, num_kv_heads)
    same_device(query=query, key=key, value=value, q_descale=q_descale,
                      k_descale=k_descale, v_descale=v_descale)
