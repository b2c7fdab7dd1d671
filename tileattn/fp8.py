"""FP8 scales, quantization and the V layout that FP8 tensor cores need."""

from __future__ import annotations

import torch

from .arch import FP8_DTYPES
from .kernels.runtime import on_device
from .kernels.attention.layout import transpose_v_launch


def quantize_fp8(x: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn,
                 per: str = "tensor") -> tuple[torch.Tensor, torch.Tensor]:
    """Scale x [B, S, H, D] into FP8's range; returns (x_fp8, descale) with x ≈ x_fp8 * descale.

    per="tensor": one float32 scalar descale. per="head": float32 [B, H], one per (batch, head),
    which keeps a quiet head from losing its precision to a loud one.
    """
    if dtype not in FP8_DTYPES:
        raise TypeError(f"dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")
    if per not in ("tensor", "head"):
        raise ValueError(f"per must be 'tensor' or 'head', got {per!r}")
    if per == "head" and x.dim() != 4:
        raise ValueError(f"per='head' needs x of shape [batch, seqlen, heads, head_dim], got {tuple(x.shape)}")
    x32 = x.to(torch.float32)
    if not bool(torch.isfinite(x32).all()):
        raise ValueError("x holds non-finite values (inf or nan), which no FP8 scale can "
                         "represent: a scale from them would zero or poison every value")
    if per == "tensor":
        amax = x32.abs().amax()
    else:
        amax = x32.abs().amax(dim=(1, 3))
    # An all-zero slice keeps scale 1 instead of dividing by zero.
    scale = torch.where(amax > 0, torch.finfo(dtype).max / amax, torch.ones_like(amax))
    broadcast_scale = scale if per == "tensor" else scale[:, None, :, None]
    x_fp8 = (x32 * broadcast_scale).clamp(torch.finfo(dtype).min, torch.finfo(dtype).max).to(dtype)
    return x_fp8, (1.0 / scale).to(torch.float32)


def is_k_major(v: torch.Tensor) -> bool:
    """V [B, S, H, D] whose sequence dim is contiguous (what FP8 P@V wants on sm89/sm90)."""
    return v.stride(1) == 1 and v.stride(3) != 1


def prepare_v(v: torch.Tensor) -> torch.Tensor:
    """A K-major copy of V with the same logical shape [B, S, H, D] (v.stride(1) == 1).

    Pass the result to attention() in place of v to keep the transposition out of every call,
    e.g. when a KV cache is reused across many queries.
    """
    if v.dim() != 4:
        raise ValueError(f"v must have shape [batch, seqlen, heads, head_dim], got {tuple(v.shape)}")
    if is_k_major(v):
        return v
    if v.device.type != "cuda" or v.stride(3) != 1:
        return v.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    return k_major_copy(v)


def k_major_copy(v: torch.Tensor) -> torch.Tensor:
    """V [B, S, H, D] (last dim contiguous) copied K-major by the transpose kernel."""
    out = _k_major_buffer(v)
    with on_device(v.device):
        transpose_v_launch(v, out).run()
    return out.permute(0, 3, 1, 2)


def _k_major_buffer(v: torch.Tensor) -> torch.Tensor:
    batch, seqlen, heads, head_dim = v.shape
    return torch.empty((batch, heads, head_dim, seqlen), dtype=v.dtype, device=v.device)


def bind_k_major_copy(v: torch.Tensor):
    """k_major_copy for later V tensors of v's shape, strides, dtype and alignment, with its
    launch bound (the ops' call caches); None where it cannot be bound. Call it once first."""
    bound = transpose_v_launch(v, _k_major_buffer(v)).bind()
    if bound is None:
        return None

    def run(v: torch.Tensor) -> torch.Tensor:
        out = _k_major_buffer(v)
        bound.run(v_ptr=v, out_ptr=out)
        return out.permute(0, 3, 1, 2)
    return run
