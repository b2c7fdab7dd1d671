"""tileattn in the flash-attention slot of torch's scaled_dot_product_attention (a torch with the
flash-attention registry: 2.11 and 2.13 are tested).

    from tileattn.integrations import sdpa
    sdpa.activate()   # F.scaled_dot_product_attention runs tileattn where SDPA picks flash
    sdpa.restore()    # torch's own flash kernels again

torch (2.11 on) lets a library replace the CUDA kernels behind SDPA's flash backend
(torch.nn.attention.register_flash_attention_impl / activate_flash_attention_impl, the route
of its FA3 and FA4 prototypes). activate() registers tileattn as IMPL_NAME and activates it; the
aten flash forward ops below then run tileattn where it computes exactly what was asked, and the
kernel they replaced otherwise:
  _scaled_dot_product_flash_attention           SDPA's flash forward, q/k/v [B, H, S, D]
  _scaled_dot_product_flash_attention_backward  its backward
  _flash_attention_forward                      [B, S, H, D], or packed [total, H, D] with
                                                cu_seqlens (torch.nn.attention.varlen)
  _flash_attention_forward_no_dropout_inplace   the same, writing into a given output
  _flash_attention_backward                     their backward
tileattn takes fp16/bf16 with one head dim for q, k and v in {64, 96, 128, 192, 256}, causal
or not, sliding windows, ALiBi (forward: aten's backward ops carry no slopes), packed sequences
and, forward only, (packed) paged KV caches; not dropout, the debug mask, seqused_k, nor a paged
cache behind dense queries.

Forward and backward meet through FlashAttention's conventions, so either may be torch's kernel
while the other is tileattn's: the forward returns out and the logsumexp (natural log, [B, H,
Sq] or [H, total_q], +inf for a query that sees no key so that its P is 0), and the backward
recomputes P from q, k and that logsumexp.

SDPA reaches these kernels only for CUDA tensors whose flash-backend checks pass (sm80+, fp16/
bf16, head dim <= 256, ...). Without CUDA, activate() still installs them, and the functions
below can be called directly with CPU tensors (the keyset argument is then None).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

import tileattn
from tileattn.ops import backward as tileattn_backward

from .support import HALF_DTYPES, SUPPORTED_HEAD_DIMS

__all__ = ["IMPL_NAME", "activate", "flash_attention_backward", "flash_attention_forward",
           "flash_attention_forward_no_dropout_inplace", "is_active", "register", "restore",
           "scaled_dot_product_flash_attention", "scaled_dot_product_flash_attention_backward"]

IMPL_NAME = "tileattn"
_REGISTRY_FUNCTIONS = ("register_flash_attention_impl", "activate_flash_attention_impl",
                       "restore_flash_attention_impl", "current_flash_attention_impl",
                       "list_flash_attention_impls")

# aten op -> the CUDA kernel tileattn replaced while active (None where the build has none).
_REPLACED: dict[str, object] = {}


def _attention_registry():
    import torch.nn.attention as attention
    missing = [name for name in _REGISTRY_FUNCTIONS if not hasattr(attention, name)]
    if missing or not hasattr(torch.library, "get_kernel"):
        raise RuntimeError(f"torch {torch.__version__} has no flash-attention registry "
                           f"(torch.nn.attention.{(missing or ['get_kernel'])[0]} is missing); "
                           "tileattn.integrations.sdpa needs a torch that has it "
                           "(2.11 and 2.13 are tested)")
    return attention


def register() -> str:
    """Offer tileattn to torch's flash-attention registry as IMPL_NAME (activates nothing)."""
    _attention_registry().register_flash_attention_impl(IMPL_NAME, register_fn=_install)
    return IMPL_NAME


def activate() -> None:
    """Route SDPA's flash backend through tileattn (replacing another active impl, if any)."""
    attention = _attention_registry()
    register()
    attention.activate_flash_attention_impl(IMPL_NAME)


def restore() -> None:
    """Give SDPA's flash backend back to torch's kernels, if tileattn is the active impl."""
    attention = _attention_registry()
    if attention.current_flash_attention_impl() == IMPL_NAME:
        attention.restore_flash_attention_impl()


def is_active() -> bool:
    return _attention_registry().current_flash_attention_impl() == IMPL_NAME


class _Installed:
    """The registry's handle: dropping the Library deregisters tileattn's kernels."""

    def __init__(self, library):
        self.library = library

    def remove(self) -> None:
        self.library = None
        _REPLACED.clear()


def _install() -> _Installed:
    # Ops and their arguments follow torch's version (e.g. torch 2.11 has no
    # _flash_attention_forward_no_dropout_inplace): only the ops this torch has are replaced.
    present = {op: kernel for op, kernel in _KERNELS.items() if hasattr(torch.ops.aten, op)}
    replaced = {op: _cuda_kernel(op) for op in present}
    library = torch.library.Library("aten", "IMPL", "CUDA")
    for op, kernel in present.items():
        library.impl(op, kernel, "CUDA", with_keyset=True)
    _REPLACED.update(replaced)
    return _Installed(library)


def _cuda_kernel(op: str):
    try:
        return torch.library.get_kernel(f"aten::{op}", "CUDA")
    except RuntimeError:  # a build without CUDA kernels
        return None


def _call_replaced(op: str, reason: str, keyset, *args, **kwargs):
    kernel = _REPLACED.get(op)
    if kernel is None:
        raise RuntimeError(f"tileattn does not take this aten::{op} call ({reason}) and there is "
                           "no CUDA kernel of torch's to hand it to")
    # Keyword arguments newer than this torch's schema were never given (they hold defaults).
    accepted = {argument.name for argument in getattr(torch.ops.aten, op).default._schema.arguments}
    dropped = [name for name, value in kwargs.items() if name not in accepted and value is not None]
    if dropped:
        raise RuntimeError(f"aten::{op} of torch {torch.__version__} takes no {dropped}")
    kwargs = {name: value for name, value in kwargs.items() if name in accepted}
    return kernel.call_boxed(keyset, *args, **kwargs)


# ---------------------------------------------------------------------------------------------
# The kernels, with the aten schemas' signatures (plus the dispatch keyset first)
# ---------------------------------------------------------------------------------------------

def scaled_dot_product_flash_attention(keyset, query, key, value, dropout_p=0.0, is_causal=False,
                                       return_debug_mask=False, *, scale=None):
    """aten::_scaled_dot_product_flash_attention: q/k/v [B, H, S, D] -> (out [B, H, Sq, D] with
    query's strides, logsumexp float32 [B, H, Sq], None, None, Sq, Sk, philox seed, philox
    offset, debug mask) - the seed/offset/debug placeholders of a dropout-free call."""
    args = (query, key, value, dropout_p, is_causal, return_debug_mask)
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))
    reason = _unsupported(q, k, v, dropout_p, return_debug_mask)
    if reason is not None:
        return _call_replaced("_scaled_dot_product_flash_attention", reason, keyset, *args,
                              scale=scale)
    out, lse = _forward(q, k, v, None, None, 0, 0, is_causal, scale)
    return (_strided_like(out.transpose(1, 2), query), lse, None, None, query.shape[2],
            key.shape[2], *_dropout_placeholders(query))


def flash_attention_forward(keyset, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k,
                            dropout_p, is_causal, return_debug_mask, *, scale=None,
                            window_size_left=None, window_size_right=None, seqused_k=None,
                            alibi_slopes=None, block_table=None, num_splits=None):
    """aten::_flash_attention_forward: q [B, Sq, H, D] (cum_seq_q None) or [total_q, H, D] ->
    (out like query, logsumexp float32 [B, H, Sq] or [H, total_q], philox seed, philox offset,
    debug mask). num_splits is a scheduling hint tileattn decides for itself."""
    options = dict(scale=scale, window_size_left=window_size_left,
                   window_size_right=window_size_right, seqused_k=seqused_k,
                   alibi_slopes=alibi_slopes, block_table=block_table, num_splits=num_splits)
    result = _flash_forward("_flash_attention_forward", keyset, (), query, key, value, cum_seq_q,
                            cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask,
                            options)
    if not isinstance(result, _Computed):
        return result
    return (_strided_like(result.out, query), result.lse, *_dropout_placeholders(query))


def flash_attention_forward_no_dropout_inplace(keyset, out, query, key, value, cum_seq_q,
                                               cum_seq_k, max_q, max_k, dropout_p, is_causal,
                                               return_debug_mask, *, scale=None,
                                               window_size_left=None, window_size_right=None,
                                               seqused_k=None, alibi_slopes=None,
                                               block_table=None, num_splits=None):
    """aten::_flash_attention_forward_no_dropout_inplace: flash_attention_forward writing its
    output into `out`; returns the logsumexp."""
    options = dict(scale=scale, window_size_left=window_size_left,
                   window_size_right=window_size_right, seqused_k=seqused_k,
                   alibi_slopes=alibi_slopes, block_table=block_table, num_splits=num_splits)
    result = _flash_forward("_flash_attention_forward_no_dropout_inplace", keyset, (out,), query,
                            key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                            return_debug_mask, options)
    if not isinstance(result, _Computed):
        return result
    out.copy_(result.out)
    return result.lse


class _Computed(NamedTuple):
    out: torch.Tensor
    lse: torch.Tensor


def _flash_forward(op, keyset, leading, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k,
                   dropout_p, is_causal, return_debug_mask, options):
    """The flash slots' shared body: tileattn's (out, lse) as _Computed, or, for a call
    tileattn does not cover, the replaced op's own result (its arguments: `leading` tensors,
    then the flash forward's)."""
    reason = _unsupported(query, key, value, dropout_p, return_debug_mask, cum_seq_q,
                          options["seqused_k"], options["block_table"])
    if reason is not None:
        return _call_replaced(op, reason, keyset, *leading, query, key, value, cum_seq_q,
                              cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask,
                              **options)
    window = _window(options["window_size_left"], options["window_size_right"], is_causal)
    return _Computed(*_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, is_causal,
                               options["scale"], window, options["alibi_slopes"],
                               options["block_table"]))


def scaled_dot_product_flash_attention_backward(keyset, grad_out, query, key, value, out,
                                                logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                                                dropout_p, is_causal, philox_seed, philox_offset,
                                                *, scale=None):
    """aten::_scaled_dot_product_flash_attention_backward: [B, H, S, D] tensors and the
    forward's logsumexp [B, H, Sq] -> (dq, dk, dv) with query's, key's and value's strides."""
    args = (grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
            dropout_p, is_causal, philox_seed, philox_offset)
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))
    reason = _unsupported(q, k, v, dropout_p, False)
    if reason is not None:
        return _call_replaced("_scaled_dot_product_flash_attention_backward", reason, keyset,
                              *args, scale=scale)
    grads = _backward(grad_out.transpose(1, 2), q, k, v, out.transpose(1, 2), logsumexp, None,
                      None, 0, 0, is_causal, scale, None)
    return tuple(_strided_like(grad.transpose(1, 2), x)
                 for grad, x in zip(grads, (query, key, value)))


def flash_attention_backward(keyset, grad_out, query, key, value, out, logsumexp, cum_seq_q,
                             cum_seq_k, max_q, max_k, dropout_p, is_causal, rng_state, unused,
                             *, scale=None, window_size_left=None, window_size_right=None):
    """aten::_flash_attention_backward: [B, S, H, D] tensors and logsumexp [B, H, Sq], or packed
    [total, H, D] with cu_seqlens and logsumexp [H, total_q] -> (dq, dk, dv) like q, k, v."""
    args = (grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
            dropout_p, is_causal, rng_state, unused)
    options = dict(scale=scale, window_size_left=window_size_left,
                   window_size_right=window_size_right)
    reason = _unsupported(query, key, value, dropout_p, False, cum_seq_q)
    if reason is None and key.dim() != query.dim():
        reason = "a paged KV cache"
    if reason is not None:
        return _call_replaced("_flash_attention_backward", reason, keyset, *args, **options)
    grads = _backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q,
                      max_k, is_causal, scale, _window(window_size_left, window_size_right,
                                                       is_causal))
    return tuple(_strided_like(grad, x) for grad, x in zip(grads, (query, key, value)))


_KERNELS = {
    "_scaled_dot_product_flash_attention": scaled_dot_product_flash_attention,
    "_scaled_dot_product_flash_attention_backward": scaled_dot_product_flash_attention_backward,
    "_flash_attention_forward": flash_attention_forward,
    "_flash_attention_forward_no_dropout_inplace": flash_attention_forward_no_dropout_inplace,
    "_flash_attention_backward": flash_attention_backward,
}


# ---------------------------------------------------------------------------------------------
# Shared by the kernels
# ---------------------------------------------------------------------------------------------

def _window(left, right, is_causal) -> tuple[int, int] | None:
    """FlashAttention's window as tileattn's window_size, None when it bounds nothing beyond
    causal (None and -1 mean unbounded; a causal right bound of 0 is causal itself)."""
    left = -1 if left is None or left < 0 else left
    right = -1 if right is None or right < 0 or (is_causal and right == 0) else right
    return None if (left, right) == (-1, -1) else (left, right)


def _unsupported(q, k, v, dropout_p, return_debug_mask, cum_seq_q=None, seqused_k=None,
                 block_table=None) -> str | None:
    """Why tileattn cannot compute this call exactly; None if it can. q/k/v [.., S, H, D]."""
    if dropout_p:
        return f"dropout_p={dropout_p}"
    if return_debug_mask:
        return "return_debug_mask=True"
    if seqused_k is not None:
        return "seqused_k"
    if block_table is not None and cum_seq_q is None:
        return "a paged KV cache behind dense queries"
    if not (q.dtype == k.dtype == v.dtype and q.dtype in HALF_DTYPES):
        return f"dtypes {q.dtype}/{k.dtype}/{v.dtype}"
    head_dims = {q.shape[-1], k.shape[-1], v.shape[-1]}
    if len(head_dims) != 1 or not head_dims <= set(SUPPORTED_HEAD_DIMS):
        return f"head dims {sorted(head_dims)}"
    if q.shape[-2] % k.shape[-2] != 0:
        return f"{q.shape[-2]} query heads over {k.shape[-2]} key heads"
    return None


def _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale,
             window=None, alibi_slopes=None, block_table=None):
    """tileattn on checked inputs -> (out, logsumexp in FlashAttention's layout: [B, H, Sq],
    or [H, total_q] for packed sequences). The kernels run below the autograd node of the op
    that called them, which owns the gradient (aten's flash ops have none for the ALiBi
    slopes): tileattn gets detached inputs."""
    q, k, v = (_last_dim_contiguous(x.detach()) for x in (q, k, v))
    options = {"causal": bool(is_causal), "softmax_scale": scale}
    if window is not None:
        options["window_size"] = window
    if alibi_slopes is not None:
        options["alibi_slopes"] = alibi_slopes.detach()
    if cu_seqlens_q is None:
        out, lse = tileattn.attention(q, k, v, return_lse=True, **options)
    else:
        out, lse = tileattn.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                             max_seqlen_k, block_table=block_table,
                                             return_lse=True, **options)
    # FlashAttention's backward computes P = exp(s - lse): a query that sees no key needs
    # lse = +inf there (P = 0), where tileattn reports -inf.
    return out, lse.masked_fill(lse == float("-inf"), float("inf"))


def _backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
              is_causal, scale, window):
    """tileattn's backward kernels (tileattn::attention_backward) on checked inputs; they read
    FlashAttention's logsumexp as it is (+inf or -inf for a row that saw no key: P = 0)."""
    q, k, v, out = (_last_dim_contiguous(x.detach()) for x in (q, k, v, out))
    left, right = window if window is not None else (-1, -1)
    softmax_scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    no_lse_gradient = torch.zeros_like(lse)   # aten's flash ops return lse without a gradient
    return tileattn_backward.attention_backward(
        dout.detach(), no_lse_gradient, q, k, v, out, lse.detach(), cu_seqlens_q, cu_seqlens_k,
        max_seqlen_q, max_seqlen_k, bool(is_causal), softmax_scale, left, right, 0.0, None,
        torch.are_deterministic_algorithms_enabled())


def _last_dim_contiguous(x):
    """tileattn's kernels read rows along the last dim (as FlashAttention's do)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _strided_like(out, like):
    """out with the strides torch.empty_like(like) has (what the flash ops' meta functions
    promise); copied only where tileattn's layout differs."""
    strides = torch.empty_like(like, device="meta").stride()
    if out.stride() == strides:
        return out
    return torch.empty_like(like, dtype=out.dtype).copy_(out)


def _dropout_placeholders(query):
    """Philox seed, offset and debug mask of a call without dropout (shapes of torch's meta
    functions on CUDA: uint64 [2], uint64 [], empty)."""
    device = query.device
    return (torch.zeros(2, dtype=torch.uint64, device=device),
            torch.zeros((), dtype=torch.uint64, device=device),
            torch.empty(0, dtype=query.dtype, device=device))
