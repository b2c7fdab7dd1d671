"""The public entry points: every argument check and every dispatch decision lives here.

Kernels assume what this module has checked; they never validate.
"""

from __future__ import annotations

import math

import torch

from . import fp8, reference
from .arch import FP8_DTYPES, arch_of, v_needs_k_major
from .kernels import attention_fwd, interpreter_active
from .kernels.cross_compile import on_device

SUPPORTED_HEAD_DIMS = (64, 96, 128, 192, 256)
INPUT_DTYPES = (torch.float16, torch.bfloat16) + FP8_DTYPES
OUTPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ---------------------------------------------------------------------------------------------
# Shared checks
# ---------------------------------------------------------------------------------------------

def check_tensor(name: str, x, ndim: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(x.shape)}")


def check_same_device(**tensors) -> torch.device:
    named = [(name, t) for name, t in tensors.items() if t is not None]
    device = named[0][1].device
    for name, t in named[1:]:
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but {named[0][0]} is on {device}; "
                             "all tensors must be on one device")
    return device


def check_descale(name: str, descale, batch: int, heads: int) -> None:
    if descale is None:
        return
    if not isinstance(descale, torch.Tensor):
        raise TypeError(f"{name} must be a float32 torch.Tensor or None, got {type(descale).__name__}")
    if descale.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {descale.dtype}")
    if tuple(descale.shape) not in ((), (batch, heads)):
        raise ValueError(f"{name} must have shape [] (per tensor) or [{batch}, {heads}] "
                         f"(per head), got {tuple(descale.shape)}")


# ---------------------------------------------------------------------------------------------
# attention()
# ---------------------------------------------------------------------------------------------

def _check_attention_inputs(q, k, v, causal, softmax_scale, q_descale, k_descale, v_descale,
                            out_dtype) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, x, 4)
        if x.dtype not in INPUT_DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16, float8_e4m3fn or float8_e5m2, "
                            f"got {x.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")

    batch, _, num_q_heads, head_dim = q.shape
    _, seqlen_k, num_kv_heads, _ = k.shape
    if k.shape[0] != batch or v.shape[0] != batch:
        raise ValueError(f"batch sizes differ: q {batch}, k {k.shape[0]}, v {v.shape[0]}")
    if v.shape[1] != seqlen_k:
        raise ValueError(f"k and v must have the same seqlen, got k {seqlen_k}, v {v.shape[1]}")
    if v.shape[2] != num_kv_heads:
        raise ValueError(f"k and v must have the same number of heads, got k {num_kv_heads}, "
                         f"v {v.shape[2]}")
    if num_q_heads % num_kv_heads != 0:
        raise ValueError(f"q's heads ({num_q_heads}) must be a multiple of k's heads "
                         f"({num_kv_heads}) for GQA/MQA")
    if k.shape[3] != head_dim:
        raise ValueError(f"q and k must have the same head_dim, got q {head_dim}, k {k.shape[3]}")
    for name, dim in (("q/k head_dim", head_dim), ("v head_dim", v.shape[3])):
        if dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"{name} must be one of {SUPPORTED_HEAD_DIMS}, got {dim}")
    for name, x in (("q", q), ("k", k)):
        if x.stride(3) != 1:
            raise ValueError(f"{name} must have a contiguous last dim (stride 1), got strides "
                             f"{x.stride()}")
    if v.stride(3) != 1 and not fp8.is_k_major(v):
        raise ValueError(f"v must have a contiguous last dim or a contiguous seqlen dim "
                         f"(tileattn.prepare_v), got strides {v.stride()}")

    is_fp8 = q.dtype in FP8_DTYPES
    if not is_fp8 and any(d is not None for d in (q_descale, k_descale, v_descale)):
        raise ValueError("q_descale/k_descale/v_descale apply only to FP8 inputs, "
                         f"got them with {q.dtype}")
    check_descale("q_descale", q_descale, batch, num_q_heads)
    check_descale("k_descale", k_descale, batch, num_kv_heads)
    check_descale("v_descale", v_descale, batch, num_kv_heads)
    check_same_device(q=q, k=k, v=v, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if softmax_scale is not None and not (isinstance(softmax_scale, (int, float))
                                          and math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"softmax_scale must be a positive finite float or None, got {softmax_scale!r}")
    if out_dtype is not None and out_dtype not in OUTPUT_DTYPES:
        raise TypeError(f"out_dtype must be float16, bfloat16 or float32, got {out_dtype}")


def attention(q, k, v, *, causal=False, softmax_scale=None, q_descale=None, k_descale=None,
              v_descale=None, out_dtype=None, return_lse=False):
    """Scaled dot-product attention forward, FlashAttention layout.

    q [B, Sq, Hq, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv] with Hq % Hkv == 0 (GQA/MQA),
    D and Dv in {64, 96, 128, 192, 256}, dtype fp16, bf16, float8_e4m3fn or float8_e5m2.
    causal=True aligns the mask bottom-right: query i sees keys j <= i + Sk - Sq.
    FP8 descales are float32, shape [] or [B, heads]; a missing one means 1.0.
    Returns out [B, Sq, Hq, Dv] (bf16 for FP8 inputs, else the input dtype, unless out_dtype),
    and with return_lse=True also lse float32 [B, Hq, Sq] (natural log).

    CPU tensors run the same Triton kernel when TRITON_INTERPRET=1 was set before import, and
    the fp64 reference otherwise.
    """
    _check_attention_inputs(q, k, v, causal, softmax_scale, q_descale, k_descale, v_descale,
                            out_dtype)
    batch, seqlen_q, num_q_heads, head_dim = q.shape
    is_fp8 = q.dtype in FP8_DTYPES
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    if out_dtype is None:
        out_dtype = torch.bfloat16 if is_fp8 else q.dtype

    if q.device.type == "cpu" and not interpreter_active():
        out, lse = reference.attention_reference(
            q, k, v, causal=causal, softmax_scale=softmax_scale,
            q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
        out = out.to(out_dtype)
        return (out, lse.to(torch.float32)) if return_lse else out

    arch = arch_of(q.device)
    if v_needs_k_major(arch, v.dtype) and not fp8.is_k_major(v):
        v = fp8.prepare_v(v)
    if is_fp8:
        # The kernel reads every descale; a missing one is 1.0.
        one = torch.ones((), dtype=torch.float32, device=q.device)
        q_descale, k_descale, v_descale = (one if d is None else d
                                           for d in (q_descale, k_descale, v_descale))
    out = torch.empty((batch, seqlen_q, num_q_heads, v.shape[3]), dtype=out_dtype, device=q.device)
    lse = (torch.empty((batch, num_q_heads, seqlen_q), dtype=torch.float32, device=q.device)
           if return_lse else None)
    with on_device(q.device):
        attention_fwd.attention_launch(q, k, v, out, lse, q_descale, k_descale, v_descale,
                                       softmax_scale, causal, arch).run()
    return (out, lse) if return_lse else out
