"""The forward attention op: checks, kernel choice, V layout, output allocation, launch, and the
call cache that lets repeat calls skip all of it but the launch."""

from __future__ import annotations

import torch

from .. import checks, dispatch, fp8
from ..arch import FP8_DTYPES, arch_of, v_needs_k_major
from ..kernels.attention import fwd
from ..kernels.runtime import launch_hooks_clear, on_device
from .call_cache import CallCache, tensor_key, unit_descale

_CALLS = CallCache()


def forward(q, k, v, *, causal, softmax_scale, q_descale, k_descale, v_descale, out_dtype,
            return_lse):
    """attention()'s implementation: returns out, or (out, lse) with return_lse."""
    settings = dispatch.current()
    signature = _signature(q, k, v, causal, softmax_scale, q_descale, k_descale, v_descale,
                           out_dtype, return_lse, settings)
    replay = _CALLS.get(signature)
    if replay is not None and launch_hooks_clear():
        scale = checks.softmax_scale(softmax_scale, q.shape[3])
        return replay(q, k, v, q_descale, k_descale, v_descale, scale)

    checks.no_grad("attention", q=q, k=k, v=v, q_descale=q_descale, k_descale=k_descale,
                   v_descale=v_descale)
    checks.attention_inputs(q, k, v, causal, q_descale, k_descale, v_descale, out_dtype)
    scale = checks.softmax_scale(softmax_scale, q.shape[3])
    checks.flag("return_lse", return_lse)
    is_fp8 = q.dtype in FP8_DTYPES
    out_dtype = out_dtype or (torch.bfloat16 if is_fp8 else q.dtype)
    batch, seqlen_q, num_q_heads, _ = q.shape
    out_shape = (batch, seqlen_q, num_q_heads, v.shape[3])
    lse_shape = (batch, num_q_heads, seqlen_q) if return_lse else None
    device = q.device

    if q.numel() == 0 or k.shape[1] == 0:
        # SDPA's conventions: no queries, no output; no keys, zeros and lse -inf.
        out = torch.zeros(out_shape, dtype=out_dtype, device=device)
        lse = (torch.full(lse_shape, float("-inf"), dtype=torch.float32, device=device)
               if return_lse else None)
        return (out, lse) if return_lse else out

    arch = arch_of(device)
    transposes_v = v_needs_k_major(arch, v.dtype) and not fp8.is_k_major(v)
    given_v = v
    if transposes_v:
        v = fp8.k_major_copy(v)
    if is_fp8:
        # The kernel reads every descale; a missing one is 1.0.
        q_descale, k_descale, v_descale = (unit_descale(device) if d is None else d
                                           for d in (q_descale, k_descale, v_descale))
    out = torch.empty(out_shape, dtype=out_dtype, device=device)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=device) if return_lse else None
    kernel = dispatch.attention_kernel(arch, q, k, v, causal, settings)
    with on_device(device):
        if kernel == "sm90":
            from ..kernels.attention import sm90
            launch = sm90.attention_sm90_launch(q, k, v, out, lse, scale, causal)
            run_kernel = sm90.bind_attention(causal)
        else:
            launch = fwd.attention_launch(q, k, v, out, lse, q_descale, k_descale, v_descale,
                                          scale, causal, arch)
            run_kernel = None
        launch.run()
        if signature is not None:
            run_kernel = run_kernel or fwd.bind_attention(launch)
            _CALLS.put(signature, _replay(run_kernel, device, given_v if transposes_v else None,
                                          out_shape, out_dtype, lse_shape, is_fp8))
    return (out, lse) if return_lse else out


def _signature(q, k, v, causal, softmax_scale, q_descale, k_descale, v_descale, out_dtype,
               return_lse, settings) -> tuple | None:
    """The cache key of a call, or None for a call the cache does not take (anything but plain
    CUDA tensors that do not require grad)."""
    parts = [type(causal), causal, softmax_scale is None, out_dtype, return_lse, settings]
    for x in (q, k, v, q_descale, k_descale, v_descale):
        key = tensor_key(x)
        if key is None:
            return None
        parts.append(key)
    return tuple(parts)


def _replay(run_kernel, device, transposed_v, out_shape, out_dtype, lse_shape, is_fp8):
    """A call of a signature the checks passed. run_kernel(q, k, v, out, lse, q_descale,
    k_descale, v_descale, softmax_scale) launches the chosen kernel; None when the launch
    cannot be replayed (then neither can the call)."""
    prepare_v = fp8.bind_k_major_copy(transposed_v) if transposed_v is not None else None
    if run_kernel is None or (transposed_v is not None and prepare_v is None):
        return None

    def replay(q, k, v, q_descale, k_descale, v_descale, softmax_scale):
        if is_fp8:
            q_descale, k_descale, v_descale = (unit_descale(device) if d is None else d
                                               for d in (q_descale, k_descale, v_descale))
        out = torch.empty(out_shape, dtype=out_dtype, device=device)
        lse = (torch.empty(lse_shape, dtype=torch.float32, device=device)
               if lse_shape is not None else None)
        with on_device(device):
            if prepare_v is not None:
                v = prepare_v(v)
            run_kernel(q, k, v, out, lse, q_descale, k_descale, v_descale, softmax_scale)
        return (out, lse) if lse_shape is not None else out
    return replay
