"""tileattn as a Hugging Face transformers attention backend (transformers >= 5).

    from tileattn.integrations import huggingface
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16,
                                                 attn_implementation=huggingface.register())

register() puts one name into both of transformers' registries: the attention function
(AttentionInterface) and its mask function (AttentionMaskInterface). transformers builds no mask
for a name without a mask function, so an attention function registered alone would attend to
padding tokens without a word; attention_forward refuses to run in that state.

Masks are FlashAttention's kind, never a dense [B, 1, Sq, Sk] tensor. padding_mask returns None
when every key is valid, else a boolean key mask [B, W] with W <= Sk: keys past W are the empty
slots of a static cache, and the Sq queries are the last Sq of the W positions. attention_forward
then runs
  - tileattn.attention on [B, S, H, D] views of transformers' [B, H, S, D] tensors (no copies)
    when no key is masked: prefill, and decode steps against a longer cache (Sq < Sk, causal
    aligned bottom-right);
  - tileattn.attention_varlen on the unpadded tokens when some keys are masked (left or right
    padding) or position_ids pack several sequences into one row, and pads its output again.
A sliding window becomes window_size=(sliding_window - 1, 0): transformers' masks let the query
at position p see keys p - sliding_window < j <= p (sliding_window_overlay). Gemma-2's
attn_logit_softcapping arrives as softcap.

A call tileattn cannot compute exactly runs on the model's own eager attention instead, with one
FallbackWarning per reason (see _unsupported_reason). Inputs that require grad are passed on as
they are: tileattn refuses them until it has a backward pass, and this module does not hide
that error.
"""

from __future__ import annotations

import functools
import re
import sys
import warnings
from dataclasses import dataclass

import torch

import tileattn

from .support import HALF_DTYPES, SUPPORTED_HEAD_DIMS

__all__ = ["FallbackWarning", "attention_forward", "padding_mask", "register"]

# Substrings transformers gives a meaning of its own to in an attn_implementation name ("flash"
# makes it import a flash-attn package, "sdpa"/"flex" run their dispatch checks, "paged|" and
# "eager" are built in, "/" names a hub kernel).
_RESERVED_NAME_PARTS = ("flash", "sdpa", "flex", "paged", "eager", "/")


class FallbackWarning(UserWarning):
    """A transformers attention call tileattn cannot compute exactly ran on eager attention."""


def register(name: str = "tileattn", *, fp8: bool = False) -> str:
    """Register tileattn's attention and mask functions with transformers under `name`.

    Returns `name`, for from_pretrained(..., attn_implementation=name) or
    model.set_attn_implementation(name). Registering again is harmless; the latest fp8 setting
    of a name wins. fp8=True quantizes q, k and v to float8_e4m3fn per head on every call
    (tileattn.quantize_fp8) and returns the output in the model's dtype.
    """
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        raise ValueError(f"name must be a non-empty string of letters, digits, '_', '-', '.', "
                         f"got {name!r}")
    if any(part in name.lower() for part in _RESERVED_NAME_PARTS):
        raise ValueError(f"name must not contain any of {_RESERVED_NAME_PARTS}: transformers "
                         f"treats such names specially, got {name!r}")
    if not isinstance(fp8, bool):
        raise TypeError(f"fp8 must be a bool, got {type(fp8).__name__}")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, functools.partial(attention_forward, fp8=fp8))
    AttentionMaskInterface.register(name, padding_mask)
    return name


# ---------------------------------------------------------------------------------------------
# The mask side
# ---------------------------------------------------------------------------------------------

def padding_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                 attention_mask=None, **kwargs):
    """transformers' mask function for tileattn: None (every key valid) or a boolean [B, W] key
    mask, W <= kv_length. A mask pattern with rules beyond causal, sliding window, padding and
    packing (or/and mask functions, block_sequence_ids, chunked attention) gets transformers'
    eager 4-D mask instead, which sends the call to eager attention."""
    if _has_extra_rules(mask_function, kwargs):
        from transformers.masking_utils import eager_mask
        return eager_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length,
                          q_offset=q_offset, kv_offset=kv_offset, mask_function=mask_function,
                          attention_mask=attention_mask, **kwargs)
    if attention_mask is not None:
        # The keys are the last kv_length positions (a sliding-window cache keeps only those).
        attention_mask = attention_mask[:, -kv_length:]
        if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
            return None
        return attention_mask
    # Without a 2-D mask every written key is valid; a static cache holds kv_length slots of
    # which only the first q_offset + q_length - kv_offset are written.
    num_written = int(q_offset) + q_length - kv_offset
    if num_written >= kv_length:
        return None
    return torch.ones(batch_size, num_written, dtype=torch.bool, device=kwargs.get("device"))


def _has_extra_rules(mask_function, kwargs) -> bool:
    if kwargs.get("use_vmap", False):  # transformers sets it for or_mask/and_mask functions
        return True
    if getattr(mask_function, "__name__", "") == "or_mask":  # block_sequence_ids overlay
        return True
    chunk_size = getattr(kwargs.get("config"), "attention_chunk_size", None)
    return chunk_size is not None and kwargs.get("local_size") == chunk_size


# ---------------------------------------------------------------------------------------------
# The attention side
# ---------------------------------------------------------------------------------------------

@dataclass
class _Tokens:
    """Which tokens take part. Dense: keys [:, :num_keys] are all valid. Otherwise the kept
    queries/keys are listed as (batch, position) index pairs, or all tokens are kept row-major
    (packed rows, index None), in sequences delimited by cu_seqlens (int32 [num_seqs + 1])."""
    num_keys: int
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    query_index: tuple[torch.Tensor, torch.Tensor] | None = None
    key_index: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def dense(self) -> bool:
        return self.cu_seqlens_q is None


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      sliding_window=None, softcap=None, is_causal=None, *, fp8=False, **kwargs):
    """transformers' attention function for tileattn: query [B, Hq, Sq, D], key/value
    [B, Hkv, Sk, D/Dv], attention_mask from padding_mask. Returns (out [B, Sq, Hq, Dv], None)."""
    _check_mask_side(getattr(getattr(module, "config", None), "_attn_implementation", None))
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    query, key, value = _compute_dtype_inputs(query, key, value)
    reason = _unsupported_reason(module, query, key, value, attention_mask, dropout, causal,
                                 sliding_window, kwargs)
    if reason is not None:
        return _eager_fallback(reason, module, query, key, value, attention_mask, dropout,
                               scaling, sliding_window, softcap, causal, kwargs)

    tokens = _tokens(query, key, attention_mask, kwargs)
    options = {"causal": causal, "softmax_scale": scaling}
    if sliding_window is not None:
        options["window_size"] = (sliding_window - 1, 0)
    if softcap:
        options["softcap"] = float(softcap)
    # [B, H, S, D] -> [B, S, H, D] by strides; keys past num_keys are empty static-cache slots.
    q = query.transpose(1, 2)
    k = key.transpose(1, 2)[:, :tokens.num_keys]
    v = value.transpose(1, 2)[:, :tokens.num_keys]
    if tokens.dense:
        return _attention(q, k, v, fp8, options), None
    return _attention_varlen(q, k, v, tokens, fp8, options), None


def _check_mask_side(implementation) -> None:
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    if implementation is not None and implementation not in ALL_MASK_ATTENTION_FUNCTIONS:
        raise ValueError(f"attn_implementation {implementation!r} has no mask function, so "
                         "transformers would pass no padding mask: register it with "
                         "tileattn.integrations.huggingface.register(), which adds both")


def _compute_dtype_inputs(query, key, value):
    """float32 projections under autocast (RoPE in float32, say) run in autocast's dtype, as
    FlashAttention backends do; anything else keeps its dtype."""
    device_type = query.device.type
    if (any(x.dtype == torch.float32 for x in (query, key, value))
            and torch.is_autocast_enabled(device_type)):
        dtype = torch.get_autocast_dtype(device_type)
        if dtype in HALF_DTYPES:
            return query.to(dtype), key.to(dtype), value.to(dtype)
    return query, key, value


def _unsupported_reason(module, query, key, value, attention_mask, dropout, causal,
                        sliding_window, kwargs) -> str | None:
    """Why tileattn cannot compute this call exactly; None if it can."""
    if kwargs.get("output_attentions") or getattr(getattr(module, "config", None),
                                                   "output_attentions", False):
        return "output_attentions=True (tileattn returns no attention weights)"
    if dropout:
        return f"attention dropout {dropout} (tileattn has no dropout)"
    if kwargs.get("s_aux") is not None:
        return "attention sinks (s_aux)"
    if attention_mask is not None and attention_mask.dim() != 2:
        return (f"a {attention_mask.dim()}-D attention mask (a custom mask, or a mask pattern "
                "beyond causal, sliding window, padding and packing)")
    if not (query.dtype == key.dtype == value.dtype and query.dtype in HALF_DTYPES):
        return (f"q/k/v dtypes {query.dtype}/{key.dtype}/{value.dtype} (tileattn takes fp16 or "
                "bf16 models; float32 only under autocast)")
    for name, dim in (("q/k", query.shape[-1]), ("v", value.shape[-1])):
        if dim not in SUPPORTED_HEAD_DIMS:
            return f"{name} head dim {dim} (tileattn supports {SUPPORTED_HEAD_DIMS})"
    if sliding_window is not None and not causal:
        return "a sliding window without causal masking"
    return None


def _tokens(query, key, key_mask, kwargs) -> _Tokens:
    batch, _, seqlen_q, _ = query.shape
    seqlen_k = key.shape[2]
    if key_mask is not None:
        num_keys = key_mask.shape[1]
        if not seqlen_q <= num_keys <= seqlen_k:
            raise ValueError(f"attention_mask covers {num_keys} keys; it must cover between "
                             f"Sq = {seqlen_q} and Sk = {seqlen_k}")
        if bool(key_mask.all()):  # a static cache's written slots, all valid
            return _Tokens(num_keys=num_keys)
        query_mask = key_mask[:, num_keys - seqlen_q:]  # the queries are the last Sq positions
        return _Tokens(num_keys=num_keys, **_unpadded("q", query_mask), **_unpadded("k", key_mask))
    lengths = [kwargs.get(name) for name in ("cu_seq_lens_q", "cu_seq_lens_k",
                                             "max_length_q", "max_length_k")]
    if all(x is not None for x in lengths):  # a padding-free collator's packed batch
        cu_q, cu_k, max_q, max_k = lengths
        return _Tokens(num_keys=seqlen_k, cu_seqlens_q=cu_q.to(torch.int32),
                       cu_seqlens_k=cu_k.to(torch.int32), max_seqlen_q=int(max_q),
                       max_seqlen_k=int(max_k))
    if seqlen_q == seqlen_k and seqlen_q > 1:
        starts = _sequence_starts(_packing_position_ids(kwargs), batch)
        if starts is not None:
            start_index = starts.flatten().nonzero().flatten()
            cu_seqlens = torch.nn.functional.pad(start_index, (0, 1), value=starts.numel())
            cu_seqlens = cu_seqlens.to(torch.int32)
            longest = int(cu_seqlens.diff().max())
            return _Tokens(num_keys=seqlen_k, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens,
                           max_seqlen_q=longest, max_seqlen_k=longest)
    return _Tokens(num_keys=seqlen_k)


def _packing_position_ids(kwargs) -> torch.Tensor | None:
    """position_ids that may pack several sequences per row: transformers' masks look for
    packing only when no KV cache is in use (training), and so does this module."""
    return None if kwargs.get("use_cache") else kwargs.get("position_ids")


def _sequence_starts(position_ids, batch) -> torch.Tensor | None:
    """Boolean [B, S]: where a packed sequence starts (its position id does not follow the
    previous one, or a row begins); None when no row holds more than one sequence."""
    if position_ids is None or position_ids.dim() != 2 or position_ids.shape[-1] < 2:
        return None
    position_ids = position_ids.expand(batch, -1)
    restarts = torch.diff(position_ids, dim=-1) != 1
    if not bool(restarts.any()):
        return None
    return torch.cat([torch.ones_like(restarts[:, :1]), restarts], dim=-1)


def _cumulative(lengths: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))


def _unpadded(side: str, mask: torch.Tensor) -> dict:
    lengths = mask.sum(dim=1, dtype=torch.int32)
    return {f"cu_seqlens_{side}": _cumulative(lengths), f"max_seqlen_{side}": int(lengths.max()),
            ("query_index" if side == "q" else "key_index"): mask.nonzero(as_tuple=True)}


def _quantized(q, k, v, options, num_seqs=None):
    """q, k, v in float8_e4m3fn with one descale per head (tileattn.quantize_fp8): [B, H] for
    [B, S, H, D] inputs; for unpadded [total, H, D] inputs one amax per head over all tokens,
    repeated for each of num_seqs sequences. The output keeps the model's dtype."""
    options = dict(options, out_dtype=q.dtype)
    quantized = []
    for name, x in (("q", q), ("k", k), ("v", v)):
        if num_seqs is None:
            x8, descale = tileattn.quantize_fp8(x, torch.float8_e4m3fn, per="head")
        else:
            x8, descale = tileattn.quantize_fp8(x[None], torch.float8_e4m3fn, per="head")
            x8, descale = x8[0], descale.expand(num_seqs, -1).contiguous()
        quantized.append(x8)
        options[f"{name}_descale"] = descale
    return (*quantized, options)


def _attention(q, k, v, fp8, options):
    if fp8:
        q, k, v, options = _quantized(q, k, v, options)
    return tileattn.attention(q, k, v, **options)


def _attention_varlen(q, k, v, tokens: _Tokens, fp8, options):
    batch, seqlen_q, num_q_heads, _ = q.shape
    if tokens.query_index is None:  # packed rows: every token takes part, row-major
        q, k, v = (x.reshape(-1, *x.shape[2:]) for x in (q, k, v))
    else:
        q, k, v = q[tokens.query_index], k[tokens.key_index], v[tokens.key_index]
    if fp8:
        q, k, v, options = _quantized(q, k, v, options, num_seqs=tokens.cu_seqlens_q.numel() - 1)
    out = tileattn.attention_varlen(q, k, v, tokens.cu_seqlens_q, tokens.cu_seqlens_k,
                                    tokens.max_seqlen_q, tokens.max_seqlen_k, **options)
    if tokens.query_index is None:
        return out.view(batch, seqlen_q, num_q_heads, out.shape[-1])
    padded = out.new_zeros(batch, seqlen_q, num_q_heads, out.shape[-1])
    padded[tokens.query_index] = out
    return padded


# ---------------------------------------------------------------------------------------------
# Fallback: the model's eager attention with the dense mask transformers would have built
# ---------------------------------------------------------------------------------------------

_WARNED: set[str] = set()


def _eager_fallback(reason, module, query, key, value, attention_mask, dropout, scaling,
                    sliding_window, softcap, causal, kwargs):
    if reason not in _WARNED:
        _WARNED.add(reason)
        warnings.warn(f"tileattn cannot compute this attention call exactly ({reason}); "
                      f"{type(module).__name__} runs its eager attention instead",
                      FallbackWarning, stacklevel=3)
    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if eager is None:
        raise NotImplementedError(f"tileattn cannot compute this attention call ({reason}) and "
                                  f"{type(module).__module__} has no eager_attention_forward")
    if attention_mask is None or attention_mask.dim() == 2:
        attention_mask = _additive_mask(attention_mask, query, key, causal, sliding_window,
                                        _packing_position_ids(kwargs))
    elif attention_mask.dtype == torch.bool:
        attention_mask = _additive(attention_mask, query.dtype)
    if softcap is not None:
        kwargs = dict(kwargs, softcap=softcap)
    return eager(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                 sliding_window=sliding_window, **kwargs)


def _additive_mask(key_mask, query, key, causal, sliding_window, position_ids):
    """The additive [B, 1, Sq, Sk] mask transformers' eager mask function would have built from
    the same information: key validity, causal order, sliding window and packing."""
    batch, _, seqlen_q, _ = query.shape
    seqlen_k = key.shape[2]
    device = query.device
    num_keys = seqlen_k if key_mask is None else key_mask.shape[1]
    key_position = torch.arange(seqlen_k, device=device)
    query_position = torch.arange(seqlen_q, device=device) + (num_keys - seqlen_q)
    distance = query_position[:, None] - key_position[None, :]
    visible = (key_position < num_keys)[None, :].expand(seqlen_q, -1)
    if causal:
        visible = visible & (distance >= 0)
    if sliding_window is not None:
        # transformers: causal windows keep distance < w, bidirectional ones |distance| <= w.
        visible = visible & (distance < sliding_window if causal
                             else distance.abs() <= sliding_window)
    visible = visible[None, None].expand(batch, 1, -1, -1)
    if key_mask is not None:
        padded = torch.nn.functional.pad(key_mask.to(torch.bool), (0, seqlen_k - num_keys))
        visible = visible & padded[:, None, None, :]
    elif seqlen_q == seqlen_k:
        starts = _sequence_starts(position_ids, batch)
        if starts is not None:
            sequence = starts.cumsum(-1)
            visible = visible & (sequence[:, None, :, None] == sequence[:, None, None, :])
    return _additive(visible, query.dtype)


def _additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill(
        ~visible, torch.finfo(dtype).min)
