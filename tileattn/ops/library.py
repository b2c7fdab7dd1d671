"""tileattn's torch.library custom ops (namespace `tileattn`): what torch.compile, CUDA graphs,
torch.export and autograd see instead of Triton launches.

    tileattn::attention(q, k, v, causal, softmax_scale, window_left, window_right, softcap,
                        alibi_slopes?, q_descale?, k_descale?, v_descale?, out_dtype?,
                        deterministic) -> (out, lse)
    tileattn::attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                        max_seqlen_k, causal, softmax_scale, window_left, window_right,
                        softcap, alibi_slopes?, block_table?, q_descale?, k_descale?,
                        v_descale?, out_dtype?, deterministic) -> (out, lse)
    tileattn::mla_decode(q, kv_cache, page_table, seq_lens, softmax_scale, kv_descale?,
                        work, batch_slots, partial_out!, partial_lse!, plan_fields)
                        -> (out, lse)
    tileattn::attention_backward(...) -> (dq, dk, dv)   (ops/backward.py, which also
                        registers it as the autograd of the two attention ops; deterministic
                        only matters there)

The public functions (api.py) call these ops when torch.compile traces them or for meta/fake
tensors; eager calls take the ops' implementations directly (the same functions), which keeps
the call cache's host cost, and eager calls that autograd records run them through
ops/backward.py's Functions (the ops' own autograd, without their dispatch). Each op always returns
lse (a [B, H, S] fp32 tensor, cheap next to the output); the functions drop it unless asked.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import attention as attention_ops
from . import mla as mla_ops
from .. import checks

# ---- tileattn::attention ----------------------------------------------------------------------


def attention_impl(q: Tensor, k: Tensor, v: Tensor, causal: bool, softmax_scale: float,
                   window_left: int, window_right: int, softcap: float,
                   alibi_slopes: Tensor | None, q_descale: Tensor | None,
                   k_descale: Tensor | None, v_descale: Tensor | None,
                   out_dtype: torch.dtype | None, deterministic: bool) -> tuple[Tensor, Tensor]:
    """tileattn::attention's implementation (also run without the op by eager autograd:
    ops/backward.EagerAttention)."""
    return attention_ops.forward(
        q, k, v, causal=causal, softmax_scale=softmax_scale,
        window_size=(window_left, window_right), softcap=softcap, alibi_slopes=alibi_slopes,
        q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, out_dtype=out_dtype,
        return_lse=True)


attention = torch.library.custom_op("tileattn::attention", attention_impl, mutates_args=())


@attention.register_fake
def _attention_fake(q, k, v, causal, softmax_scale, window_left, window_right, softcap,
                    alibi_slopes, q_descale, k_descale, v_descale, out_dtype, deterministic):
    checks.attention_inputs(q, k, v, causal, q_descale, k_descale, v_descale, out_dtype,
                            device_check=False)
    batch, seqlen_q, num_q_heads, _ = q.shape
    out = q.new_empty((batch, seqlen_q, num_q_heads, v.shape[3]),
                      dtype=out_dtype or attention_ops.default_out_dtype(q.dtype))
    return out, q.new_empty((batch, num_q_heads, seqlen_q), dtype=torch.float32)


# ---- tileattn::attention_varlen ---------------------------------------------------------------


def attention_varlen_impl(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                          cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                          causal: bool, softmax_scale: float, window_left: int,
                          window_right: int, softcap: float, alibi_slopes: Tensor | None,
                          block_table: Tensor | None, q_descale: Tensor | None,
                          k_descale: Tensor | None, v_descale: Tensor | None,
                          out_dtype: torch.dtype | None,
                          deterministic: bool) -> tuple[Tensor, Tensor]:
    """tileattn::attention_varlen's implementation (also run by ops/backward.EagerVarlen)."""
    return attention_ops.varlen_forward(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
        softmax_scale=softmax_scale, window_size=(window_left, window_right), softcap=softcap,
        alibi_slopes=alibi_slopes, block_table=block_table, q_descale=q_descale,
        k_descale=k_descale, v_descale=v_descale, out_dtype=out_dtype, return_lse=True,
        validate=None)


attention_varlen = torch.library.custom_op("tileattn::attention_varlen", attention_varlen_impl,
                                           mutates_args=())


@attention_varlen.register_fake
def _attention_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           causal, softmax_scale, window_left, window_right, softcap,
                           alibi_slopes, block_table, q_descale, k_descale, v_descale,
                           out_dtype, deterministic):
    out = q.new_empty((q.shape[0], q.shape[1], v.shape[-1]),
                      dtype=out_dtype or attention_ops.default_out_dtype(q.dtype))
    return out, q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


# ---- tileattn::mla_decode ---------------------------------------------------------------------


@torch.library.custom_op("tileattn::mla_decode", mutates_args=("partial_out", "partial_lse"))
def mla_decode(q: Tensor, kv_cache: Tensor, page_table: Tensor, seq_lens: Tensor,
               softmax_scale: float, kv_descale: Tensor | None, work: Tensor,
               batch_slots: Tensor, partial_out: Tensor, partial_lse: Tensor,
               plan_fields: list[int]) -> tuple[Tensor, Tensor]:
    plan = mla_ops.plan_from_fields(q, kv_cache, seq_lens, work, batch_slots, partial_out,
                                    partial_lse, plan_fields)
    return mla_ops.decode(q, kv_cache, page_table, seq_lens, softmax_scale=softmax_scale,
                          kv_descale=kv_descale, plan=plan, return_lse=True, validate=None)


@mla_decode.register_fake
def _mla_decode_fake(q, kv_cache, page_table, seq_lens, softmax_scale, kv_descale, work,
                     batch_slots, partial_out, partial_lse, plan_fields):
    batch, q_len, num_heads, _ = q.shape
    return (q.new_empty((batch, q_len, num_heads, 512)),
            q.new_empty((batch, q_len, num_heads), dtype=torch.float32))
