"""The forward attention ops, dense (attention()) and packed (attention_varlen()): checks,
kernel choice, V layout, output allocation, launch, and the call cache that lets repeat dense
calls skip all of it but the launch."""

from __future__ import annotations

import torch

from .. import checks, dispatch, fp8
from ..arch import FP8_DTYPES, arch_of, v_needs_k_major
from ..kernels import mods
from ..kernels.attention import fwd
from ..kernels.runtime import launch_hooks_clear, on_device
from .call_cache import CallCache, tensor_key, unit_descale

_CALLS = CallCache()


def default_out_dtype(dtype: torch.dtype) -> torch.dtype:
    """bf16 for FP8 inputs, else the inputs' dtype."""
    return torch.bfloat16 if dtype in FP8_DTYPES else dtype


def masks_for(causal, window_size, softcap, alibi_slopes) -> fwd.Masks:
    """The kernel's Masks for attention()'s mask arguments (already checked)."""
    score_mod, _, mod_args = mods.builtin(softcap, alibi_slopes)
    left, right = window_size
    return fwd.Masks(causal=causal, window_left=left, window_right=0 if causal else right,
                     score_mod=score_mod, mod_args=mod_args)


def forward(q, k, v, *, causal, softmax_scale, window_size, softcap, alibi_slopes, q_descale,
            k_descale, v_descale, out_dtype, return_lse):
    """attention()'s implementation: returns out, or (out, lse) with return_lse."""
    settings = dispatch.current()
    signature = _signature(q, k, v, causal, softmax_scale, window_size, softcap, alibi_slopes,
                           q_descale, k_descale, v_descale, out_dtype, return_lse, settings)
    replay = _CALLS.get(signature)
    if replay is not None and launch_hooks_clear():
        scale = checks.softmax_scale(softmax_scale, q.shape[3])
        _, _, mod_args = mods.builtin(checks.softcap(softcap), alibi_slopes)
        return replay(q, k, v, q_descale, k_descale, v_descale, scale, mod_args)

    checks.attention_inputs(q, k, v, causal, q_descale, k_descale, v_descale, out_dtype)
    scale = checks.softmax_scale(softmax_scale, q.shape[3])
    checks.flag("return_lse", return_lse)
    window = checks.window_size(window_size)
    cap = checks.softcap(softcap)
    batch, seqlen_q, num_q_heads, _ = q.shape
    checks.alibi_slopes(alibi_slopes, batch, num_q_heads, q.device)
    masks = masks_for(causal, window, cap, alibi_slopes)
    is_fp8 = q.dtype in FP8_DTYPES
    out_dtype = out_dtype or default_out_dtype(q.dtype)
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
        v = fp8.k_major_like(given_v)    # filled once the kernel is chosen
    if is_fp8:
        # The kernel reads every descale; a missing one is 1.0.
        q_descale, k_descale, v_descale = _unit_if_none(device, q_descale, k_descale, v_descale)
    out = torch.empty(out_shape, dtype=out_dtype, device=device)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=device) if return_lse else None
    # The Hopper kernel has softcap, ALiBi (its score hook) and left windows; a right window
    # bound other than causal's runs the portable one.
    hopper_masks = causal or window[1] == -1
    kernel = (dispatch.attention_kernel(arch, q, k, v, causal, settings)
              if hopper_masks else "portable")
    # A V copied here goes to the Hopper kernel in grouped key order (kernels/attention/
    # layout.py): its FP8 P then feeds P @ V without a register shuffle.
    grouped_v = transposes_v and kernel == "sm90"
    if transposes_v:
        v = fp8.k_major_copy(given_v, grouped_v, out=v)
    with on_device(device):
        if kernel == "sm90":
            from ..kernels.attention import sm90
            alibi = mods.alibi if alibi_slopes is not None else None
            launch = sm90.attention_sm90_launch(
                q, k, v, out, lse, scale, causal, softcap=cap, window_left=window[0],
                score_mod=alibi, mod_args=masks.mod_args if alibi is not None else (),
                q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                v_keys_grouped=grouped_v)
        else:
            launch = fwd.attention_launch(q, k, v, out, lse, q_descale, k_descale, v_descale,
                                          scale, causal, arch, masks=masks)
        launch.run()
        if signature is not None:
            run_kernel = (sm90.bind_attention(launch, alibi) if kernel == "sm90"
                          else fwd.bind_attention(launch))
            _CALLS.put(signature, _replay(run_kernel, device, given_v if transposes_v else None,
                                          out_shape, out_dtype, lse_shape, is_fp8, grouped_v))
    return (out, lse) if return_lse else out


def _signature(q, k, v, causal, softmax_scale, window_size, softcap, alibi_slopes, q_descale,
               k_descale, v_descale, out_dtype, return_lse, settings) -> tuple | None:
    """The cache key of a call, or None for a call the cache does not take (anything but plain
    CUDA tensors that do not require grad, or mask arguments of unexpected types)."""
    if type(window_size) is not tuple or type(softcap) not in (float, int):
        return None
    parts = [type(causal), causal, softmax_scale is None, window_size, softcap > 0, out_dtype,
             return_lse, settings]
    for x in (q, k, v, q_descale, k_descale, v_descale, alibi_slopes):
        key = tensor_key(x)
        if key is None:
            return None
        parts.append(key)
    return tuple(parts)


def _unit_if_none(device, *descales):
    """The descales with a missing one as 1.0 (the kernels read every descale)."""
    return tuple(unit_descale(device) if d is None else d for d in descales)


def _fresh_outputs(device, out_shape, out_dtype, lse_shape):
    """(out, lse or None) of a replayed call."""
    out = torch.empty(out_shape, dtype=out_dtype, device=device)
    lse = (torch.empty(lse_shape, dtype=torch.float32, device=device)
           if lse_shape is not None else None)
    return out, lse


def _replay(run_kernel, device, transposed_v, out_shape, out_dtype, lse_shape, is_fp8,
            grouped_v=False):
    """A call of a signature the checks passed. run_kernel(q, k, v, out, lse, q_descale,
    k_descale, v_descale, softmax_scale, mod_args) launches the chosen kernel; None when the
    launch cannot be replayed (then neither can the call)."""
    prepare_v = (fp8.bind_k_major_copy(transposed_v, grouped_v) if transposed_v is not None
                 else None)
    if run_kernel is None or (transposed_v is not None and prepare_v is None):
        return None

    def replay(q, k, v, q_descale, k_descale, v_descale, softmax_scale, mod_args):
        if is_fp8:
            q_descale, k_descale, v_descale = _unit_if_none(device, q_descale, k_descale,
                                                            v_descale)
        out, lse = _fresh_outputs(device, out_shape, out_dtype, lse_shape)
        with on_device(device):
            if prepare_v is not None:
                v = prepare_v(v)
            run_kernel(q, k, v, out, lse, q_descale, k_descale, v_descale, softmax_scale,
                       mod_args)
        return (out, lse) if lse_shape is not None else out
    return replay


# Queries per sequence up to which a paged batch runs the split-KV decode kernel (ops/decode.py)
# rather than the prefill kernel, whose query tiles would be mostly empty rows.
DECODE_MAX_Q_LEN = 16


_VARLEN_CALLS = CallCache()


def _varlen_signature(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                      softmax_scale, window_size, softcap, alibi_slopes, block_table, q_descale,
                      k_descale, v_descale, out_dtype, return_lse, validate) -> tuple | None:
    """The varlen call cache's key (_signature's, plus the index tensors and the max lengths,
    which set the grid), or None for a call it does not take."""
    if (type(window_size) is not tuple or type(softcap) not in (float, int)
            or type(max_seqlen_q) is not int or type(max_seqlen_k) is not int):
        return None
    parts = [type(causal), causal, softmax_scale is None, window_size, softcap > 0, out_dtype,
             return_lse, validate, max_seqlen_q, max_seqlen_k, dispatch.current()]
    for x in (q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, q_descale, k_descale, v_descale,
              alibi_slopes):
        key = tensor_key(x)
        if key is None:
            return None
        parts.append(key)
    return tuple(parts)


def varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal,
                   softmax_scale, window_size, softcap, alibi_slopes, block_table, q_descale,
                   k_descale, v_descale, out_dtype, return_lse, validate, plan=None):
    """attention_varlen()'s implementation. A signature seen before (prefill calls, not
    decode) replays its bound launch, as attention()'s call cache does: the checks of shapes
    and dtypes and the launch setup are skipped; values are still checked where
    validate asks for it."""
    signature = None
    if plan is None:
        signature = _varlen_signature(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                      max_seqlen_k, causal, softmax_scale, window_size, softcap,
                                      alibi_slopes, block_table, q_descale, k_descale,
                                      v_descale, out_dtype, return_lse, validate)
        replay = _VARLEN_CALLS.get(signature)
        if replay is not None:
            return replay(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, q_descale,
                          k_descale, v_descale, softmax_scale, softcap, alibi_slopes, causal,
                          window_size, validate)
    max_q, max_k = checks.varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                        max_seqlen_k, block_table, q_descale, k_descale,
                                        v_descale, out_dtype)
    scale = checks.softmax_scale(softmax_scale, q.shape[2])
    checks.flag("causal", causal)
    checks.flag("return_lse", return_lse)
    window = checks.window_size(window_size)
    cap = checks.softcap(softcap)
    batch = cu_seqlens_q.shape[0] - 1
    num_q_heads = q.shape[1]
    checks.alibi_slopes(alibi_slopes, batch, num_q_heads, q.device)
    if validate is not None:
        checks.flag("validate", validate)
    capturing = q.is_cuda and torch.cuda.is_current_stream_capturing()
    if validate and capturing:
        raise ValueError("validate=True reads cu_seqlens and block_table on the host, which a "
                         "CUDA graph capture cannot do: pass validate=None or False there")
    host_checks = validate or (validate is None and not capturing)
    if host_checks:
        checks.varlen_values(q, k, cu_seqlens_q, cu_seqlens_k, max_q, max_k, block_table)
    decode = block_table is not None and (plan is not None or max_q <= DECODE_MAX_Q_LEN)
    if plan is not None and block_table is None:
        raise ValueError("plan (tileattn.decode_plan) applies to a paged cache: pass block_table")
    if q.dtype != k.dtype and not decode:
        raise ValueError(f"a {q.dtype} q over a {k.dtype} cache runs the decode kernel only: at "
                         f"most {DECODE_MAX_Q_LEN} queries per sequence (max_seqlen_q is {max_q})")
    if decode and q.shape[0] > 0:
        from . import decode as decode_op
        score_mod, _, mod_args = mods.builtin(cap, alibi_slopes)
        return decode_op.paged_decode(
            q, k, v, block_table, cu_seqlens_k=cu_seqlens_k, cu_seqlens_q=cu_seqlens_q,
            plan=plan, causal=causal, softmax_scale=scale, window_size=window,
            score_mod=score_mod, mod_args=mod_args, q_descale=q_descale, k_descale=k_descale,
            v_descale=v_descale, out_dtype=out_dtype, return_lse=return_lse,
            validate=bool(validate))

    masks = masks_for(causal, window, cap, alibi_slopes)
    is_fp8 = q.dtype in FP8_DTYPES
    out_dtype = out_dtype or default_out_dtype(q.dtype)
    device = q.device
    out = torch.empty((q.shape[0], num_q_heads, v.shape[-1]), dtype=out_dtype, device=device)
    lse = (torch.empty((num_q_heads, q.shape[0]), dtype=torch.float32, device=device)
           if return_lse else None)
    if q.shape[0] == 0 or batch == 0 or max_q == 0:
        return (out, lse) if return_lse else out
    arch = arch_of(device)
    if is_fp8:
        q_descale, k_descale, v_descale = _unit_if_none(device, q_descale, k_descale, v_descale)
    # Packed FP8 V goes K-major with each sequence at an aligned row (fp8.packed_k_major_copy):
    # at its own first key's offset no vectorized load could assume alignment (docs/design.md,
    # "Serving masks and varlen/paged prefill"). Paged caches keep their layout.
    aligned_v = block_table is None and v_needs_k_major(arch, v.dtype)
    if aligned_v:
        v = fp8.packed_k_major_copy(v, cu_seqlens_k, max(max_k, 1))
    sequences = fwd.Sequences(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                              max_seqlen_q=max_q, max_seqlen_k=max(max_k, 1),
                              block_table=block_table, v_aligned_starts=aligned_v)
    # The Hopper kernel: no paging yet, right window bound causal's or none.
    hopper = (block_table is None and (causal or window[1] == -1)
              and dispatch.varlen_kernel(arch, q, k, v, max_q, max_k, causal,
                                         dispatch.current()) == "sm90")
    with on_device(device):
        if hopper:
            from ..kernels.attention import sm90
            alibi = mods.alibi if alibi_slopes is not None else None
            launch = sm90.attention_sm90_launch(
                q, k, v, out, lse, scale, causal, softcap=cap, window_left=window[0],
                sequences=sequences, score_mod=alibi,
                mod_args=masks.mod_args if alibi is not None else ())
        else:
            launch = fwd.attention_launch(q, k, v, out, lse, q_descale, k_descale, v_descale,
                                          scale, causal, arch, masks=masks, sequences=sequences)
        launch.run()
        if signature is not None:
            run_kernel = (sm90.bind_attention(launch, alibi) if hopper
                          else fwd.bind_attention(launch))
            _VARLEN_CALLS.put(signature, _varlen_replay(
                run_kernel, device, aligned_v, max_q, max_k, out.shape, out.dtype,
                None if lse is None else lse.shape, is_fp8))
    return (out, lse) if return_lse else out


def _varlen_replay(run_kernel, device, aligned_v: bool, max_q: int, max_k: int, out_shape,
                   out_dtype, lse_shape, is_fp8: bool):
    """A call of a varlen signature the checks passed (see _replay). run_kernel(q, k, v, out,
    lse, q_descale, k_descale, v_descale, softmax_scale, mod_args, cu_seqlens_q, cu_seqlens_k,
    block_table) launches the chosen kernel; None when it cannot be replayed."""
    if run_kernel is None:
        return None

    def replay(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, q_descale, k_descale,
               v_descale, softmax_scale, softcap, alibi_slopes, causal, window_size, validate):
        scale = checks.softmax_scale(softmax_scale, q.shape[2])
        masks = masks_for(causal, window_size, checks.softcap(softcap), alibi_slopes)
        if validate or (validate is None and not torch.cuda.is_current_stream_capturing()):
            checks.varlen_values(q, k, cu_seqlens_q, cu_seqlens_k, max_q, max_k, block_table)
        if is_fp8:
            q_descale, k_descale, v_descale = _unit_if_none(device, q_descale, k_descale,
                                                            v_descale)
        out, lse = _fresh_outputs(device, out_shape, out_dtype, lse_shape)
        with on_device(device):
            if aligned_v:
                v = fp8.packed_k_major_copy(v, cu_seqlens_k, max(max_k, 1))
            run_kernel(q, k, v, out, lse, q_descale, k_descale, v_descale, scale,
                       masks.mod_args, cu_seqlens_q, cu_seqlens_k, block_table)
        return (out, lse) if lse_shape is not None else out
    return replay
