"""The public functions: signatures, documentation, and the call into their ops.

Argument checks live in checks.py, kernel choices in dispatch.py, and each op's orchestration
(layouts, allocation, launches, call cache) in ops/.
"""

from __future__ import annotations

import math

import torch

from . import checks
from .dispatch import use_kernels
from .ops import attention as attention_op
from .ops import backward as backward_ops
from .ops import decode as decode_op
from .ops import library
from .ops import mla as mla_op
from .ops.mla import PerformanceWarning

__all__ = ["PerformanceWarning", "attention", "attention_varlen", "decode_plan", "mla_decode",
           "mla_plan", "use_kernels"]


def attention(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
              alibi_slopes=None, q_descale=None, k_descale=None, v_descale=None,
              out_dtype=None, return_lse=False, deterministic=False):
    """Scaled dot-product attention forward, FlashAttention layout.

    q [B, Sq, Hq, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv] with Hq % Hkv == 0 (GQA/MQA),
    D and Dv in {64, 96, 128, 192, 256}, dtype fp16, bf16, float8_e4m3fn or float8_e5m2.
    Masks are bottom-right aligned: query i sits at position p = i + Sk - Sq.
      causal=True: query i sees keys j <= p.
      window_size=(left, right): keys p - left <= j <= p + right (-1: unbounded; causal sets
        right = 0). The work scales with the window, not with Sq * Sk.
      softcap > 0: scores s = scale * q.k become softcap * tanh(s / softcap), before ALiBi.
      alibi_slopes: float32 [Hq] or [B, Hq]; adds -slope * |p - j| to the scores.
    softmax_scale: a positive number (default 1/sqrt(D)).
    FP8 descales are float32, shape [] or [B, heads] (q's and k's also [B, heads, ceil(S / 128)],
    one per 128-row block: quantize_qkv_fp8's per="block"); a missing one means 1.0.
    Returns out [B, Sq, Hq, Dv] (bf16 for FP8 inputs, else the input dtype, unless out_dtype),
    and with return_lse=True also lse float32 [B, Hq, Sq] (natural log). Empty inputs follow
    PyTorch's SDPA: no queries give an empty output; no keys give zeros and lse -inf.

    Differentiable for fp16/bf16 inputs (q, k, v; lse too): the backward recomputes P from the
    saved out and lse (FlashAttention's memory; extra: 4 bytes per query row and head).
    deterministic=True accumulates dq in a fixed order (a separate pass over the keys); the
    default lets Hopper's fused backward add dq by fp32 reductions where it runs (faster
    there; the order of additions varies run to run), and elsewhere also runs the pass.
    FP8 inputs are forward-only.

    Tensors must be on a CUDA GPU, or on the CPU with TRITON_INTERPRET=1 set before import
    (the same Triton kernels run in Triton's interpreter).
    """
    route = _route("attention", dict(q=q, k=k, v=v), dict(
        q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, alibi_slopes=alibi_slopes))
    if route is not None:
        op = library.attention if route == "op" else backward_ops.EagerAttention.apply
        out, lse = op(q, k, v, causal, _scale(softmax_scale, q), *window_size, float(softcap),
                      alibi_slopes, q_descale, k_descale, v_descale, out_dtype,
                      checks.flag("deterministic", deterministic))
        return (out, lse) if return_lse else out
    return attention_op.forward(q, k, v, causal=causal, softmax_scale=softmax_scale,
                                window_size=window_size, softcap=softcap,
                                alibi_slopes=alibi_slopes, q_descale=q_descale,
                                k_descale=k_descale, v_descale=v_descale, out_dtype=out_dtype,
                                return_lse=return_lse)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                     causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                     alibi_slopes=None, block_table=None, q_descale=None, k_descale=None,
                     v_descale=None, out_dtype=None, return_lse=False, validate=None,
                     deterministic=False, plan=None):
    """Attention over packed sequences of different lengths (FlashAttention's varlen layout),
    with K/V packed or in a paged cache.

    q [total_q, Hq, D]; k, v [total_k, Hkv, D/Dv], or with block_table int32 [B, max_pages]
    paged caches [num_pages, page_size, Hkv, D/Dv] where sequence b's keys are the first
    cu_seqlens_k[b+1] - cu_seqlens_k[b] rows of its pages in order (any page_size >= 1).
    cu_seqlens_q/k int32 [B + 1], prefix sums from 0 (empty sequences allowed); max_seqlen_q/k
    bound the sequence lengths. Masks, softcap, ALiBi (slopes [Hq] or [B, Hq]), dtypes and
    descales ([] or [B, heads]) as attention(), per sequence: one call mixes fresh prefill,
    chunked prefill over a cached prefix and decode (Sq = 1).
    Returns out [total_q, Hq, Dv] and, with return_lse, lse float32 [Hq, total_q].
    Differentiable for fp16/bf16 with packed K/V (not with a block_table), as attention().

    Decode: with a block_table and at most DECODE_MAX_Q_LEN queries per sequence, the call
    runs the split-KV decode kernel (all query heads of a GQA group share each K/V page read).
    plan (tileattn.decode_plan, made once per step outside a CUDA graph) makes such calls
    graph-capturable: no host synchronisation, no allocation besides the outputs.

    validate: by default (None) the index tensors' values are checked on the host (one
    synchronisation) outside CUDA graph capture and raise ValueError when inconsistent;
    validate=False skips that on a hot path. Whatever validate says, the kernel never reads or
    writes outside its tensors, and page ids outside the cache give NaN rows.
    """
    paged = block_table is not None     # no gradient for a paged cache
    route = _route("attention_varlen", dict(q=q) if paged else dict(q=q, k=k, v=v), dict(
        k=k if paged else None, v=v if paged else None, q_descale=q_descale,
        k_descale=k_descale, v_descale=v_descale, alibi_slopes=alibi_slopes))
    if route is not None:
        op = library.attention_varlen if route == "op" else backward_ops.EagerAttentionVarlen.apply
        out, lse = op(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
            _scale(softmax_scale, q), *window_size, float(softcap), alibi_slopes, block_table,
            q_descale, k_descale, v_descale, out_dtype, checks.flag("deterministic", deterministic))
        return (out, lse) if return_lse else out
    return attention_op.varlen_forward(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, plan=plan, causal=causal,
        softmax_scale=softmax_scale, window_size=window_size, softcap=softcap,
        alibi_slopes=alibi_slopes, block_table=block_table, q_descale=q_descale,
        k_descale=k_descale, v_descale=v_descale, out_dtype=out_dtype, return_lse=return_lse,
        validate=validate)


def decode_plan(seq_lens_k=None, *, cu_seqlens_k=None, num_q_heads, num_kv_heads, q_len=1,
                page_size, head_dim, head_dim_v=None, kv_dtype, device=None,
                window_size=(-1, -1)):
    """The split-KV plan of one decode step for attention_varlen(..., block_table=...,
    plan=...): work items over the key counts (seq_lens_k int32 [B], or cu_seqlens_k
    [B + 1]; read once, a host synchronisation), their workspace, and what the plan was made
    for. Calls with other key counts or more than q_len queries per sequence write NaN rows
    and raise on the host outside graph capture. A plan made with a left window serves calls
    with the same or a smaller one."""
    return decode_op.decode_plan(seq_lens_k, cu_seqlens_k=cu_seqlens_k, num_q_heads=num_q_heads,
                                 num_kv_heads=num_kv_heads, q_len=q_len, page_size=page_size,
                                 head_dim=head_dim, head_dim_v=head_dim_v, kv_dtype=kv_dtype,
                                 device=device, window_size=window_size)


def mla_plan(seq_lens, *, num_heads, q_len=1, page_size, kv_dtype, device, schedule=None,
             kernel=None):
    """The split-KV plan for one decode step's batch layout: work items, workspace and the
    kernel they run, for every layer of the step.

    Reads seq_lens once (a host synchronisation), so make it outside a CUDA graph. A plan is
    valid for these seq_lens only: mla_decode refuses it (outside graph capture) or writes NaN
    (inside) when given others. schedule picks the config knob ("split_dv" or "dup_qk", see
    tileattn/kernels/mla/decode.py) and kernel the partial kernel ("triton" or "gluon"); None
    takes the chip's defaults (tileattn.use_kernels may override them).
    """
    return mla_op.make_plan(seq_lens, num_heads=num_heads, q_len=q_len, page_size=page_size,
                            kv_dtype=kv_dtype, device=device, schedule=schedule, kernel=kernel)


def mla_decode(q, kv_cache, page_table, seq_lens, *, softmax_scale, kv_descale=None, plan=None,
               return_lse=False, validate=None):
    """DeepSeek MLA decode over a paged latent KV cache.

    q [B, q_len, H, 576] fp16/bf16 with H in {16, 32, 64, 128} and q_len in 1..4 (speculative
    decoding: token j sees the first seq_len - q_len + 1 + j keys); kv_cache
    [num_pages, page_size, 576] in q's dtype or float8_e4m3fn (then kv_descale, a float32
    scalar, defaults to 1.0), whose first 512 columns are also V; page_table int32
    [B, max_pages]; seq_lens int32 [B] (keys per sequence, the q_len new tokens included).
    Returns out [B, q_len, H, 512] in q's dtype, and with return_lse=True also lse float32
    [B, q_len, H] (natural log).

    Without a plan, one is made here (host sync, allocation). With a plan (tileattn.mla_plan,
    from these seq_lens) the call allocates only out/lse and can be captured in a CUDA graph.

    Safety (validate): by default, outside CUDA graph capture, page ids and the plan's seq_lens
    are checked on the host (one synchronisation) and a bad one raises ValueError;
    validate=False skips that on a hot path. Whatever validate says, the kernels never read
    outside kv_cache (an out-of-range page id is not followed: it reads page 0, a wrong but
    bounded answer inside a graph), and rows of a stale plan come out NaN.
    """
    if plan is not None and _route("mla_decode", {}, dict(q=q, kv_cache=kv_cache,
                                                         kv_descale=kv_descale)) == "op":
        out, lse = library.mla_decode(
            q, kv_cache, page_table, seq_lens, float(softmax_scale), kv_descale, plan.work,
            plan.batch_slots, plan.partial_out, plan.partial_lse, mla_op.plan_fields(plan))
        return (out, lse) if return_lse else out
    return mla_op.decode(q, kv_cache, page_table, seq_lens, softmax_scale=softmax_scale,
                         kv_descale=kv_descale, plan=plan, return_lse=return_lse,
                         validate=validate)


def _route(function: str, differentiable: dict, constant: dict) -> str | None:
    """How a call runs: "op" through its custom op (ops/library.py) while torch.compile
    traces and for tensors other than plain ones (meta, fake, functional); "autograd" where
    eager autograd records a graph (ops/backward.py's Functions: the op's autograd without its
    dispatch); None for the op's implementation directly. Tensors in `constant` have no
    gradient: one that requires grad while autograd records is refused, as are
    differentiable ones of a dtype without a backward pass (FP8)."""
    if torch.compiler.is_compiling():
        return "op"
    grad = torch.is_grad_enabled()
    needs_grad = False
    for name, t in (*differentiable.items(), *constant.items()):
        if not isinstance(t, torch.Tensor):
            continue        # the checks name it
        if type(t) is not torch.Tensor or t.device.type == "meta":
            return "op"
        if grad and t.requires_grad:
            if name not in differentiable or t.dtype not in (torch.float16, torch.bfloat16):
                checks.no_grad(function, **{name: t})
            needs_grad = True
    return "autograd" if needs_grad else None


def _scale(softmax_scale, q) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(q.shape[-1])
    return checks.positive_float("softmax_scale", softmax_scale)
