"""The flex_attention op: translate the user's functions into kernel hooks, turn the BlockMask
into block lists, and run the portable forward kernel with them.

attention_with_mods is the kernel entry point (tests call it directly, NaN-poisoned):

    attention_with_mods(q, k, v, out, lse, *, softmax_scale, score_mod, mask_mod, mod_args,
                        block_mask_tensors, q_descale, k_descale, v_descale) -> None

    q [B, Sq, Hq, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv]: any strides with the last dim
    contiguous (flex's [B, H, S, D] transposed; batch stride 0 when one K/V serves every
    sequence); out [B, Sq, Hq, Dv] written in full; lse None or float32 [B, Hq, Sq]; hooks
    as docs/design.md ("Mods"); block_mask_tensors a flex.block_mask.BlockMaskTensors or None
    (then every key block is visited and no mask hook applies); FP8 descales never None.
    A BlockMask is literal: no built-in causal or window mask (top-left aligned when
    Sq != Sk). Tiles are shrunk to divide the mask blocks.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .. import checks, dispatch, fp8
from ..arch import FP8_DTYPES, arch_of, v_needs_k_major
from ..flex import checks as flex_checks
from ..flex.block_mask import block_mask_tensors, largest_tile
from ..flex.translate import translate_mods
from ..kernels.attention import fwd
from ..kernels.runtime import on_device
from . import flex_backward
from .call_cache import unit_descale


# Under torch.compile the call is a graph break: dynamo cannot trace the translation of Python
# callables nor the kernels' launch path (the interpreter's on a CPU), so the op runs eagerly
# between compiled graphs, its autograd node included.
@torch.compiler.disable
def forward(query, key, value, *, score_mod, block_mask, scale, enable_gqa, return_lse,
            q_descale, k_descale, v_descale):
    """flex_attention()'s implementation."""
    flex_checks.flex_inputs(query, key, value, score_mod, block_mask, scale, enable_gqa, return_lse,
                       q_descale, k_descale, v_descale)
    batch, num_q_heads, seqlen_q, head_dim = query.shape
    seqlen_k = key.shape[2]
    device = query.device
    checks.runnable_device("query", device)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    mask_mod = None if block_mask is None else block_mask.mask_mod
    hooks = translate_mods(score_mod, mask_mod, device=device)
    block_lists = None
    if block_mask is not None:
        block_lists = block_mask_tensors(block_mask, batch=batch, num_q_heads=num_q_heads,
                                         seqlen_q=seqlen_q, seqlen_k=seqlen_k, device=device)
    # One K/V for every batch entry (torch allows it): the kernels see it expanded.
    key_all, value_all = (x.expand(batch, *x.shape[1:]) for x in (key, value))
    is_fp8 = query.dtype in FP8_DTYPES
    if is_fp8:
        q_descale, k_descale, v_descale = (unit_descale(device) if d is None else d
                                           for d in (q_descale, k_descale, v_descale))
    out_dtype = torch.bfloat16 if is_fp8 else query.dtype

    def run(with_lse: bool):
        out = torch.empty((batch, num_q_heads, seqlen_q, value.shape[3]), dtype=out_dtype,
                          device=device)
        lse = (torch.empty((batch, num_q_heads, seqlen_q), dtype=torch.float32, device=device)
               if with_lse else None)
        with on_device(device):
            attention_with_mods(
                query.transpose(1, 2), key_all.transpose(1, 2), value_all.transpose(1, 2),
                out.transpose(1, 2), lse, softmax_scale=scale, score_mod=hooks.score_mod,
                mask_mod=hooks.mask_mod, mod_args=hooks.mod_args, block_mask_tensors=block_lists,
                q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                score_linear=hooks.score_linear,
                mask_uses=hooks.mask_uses if hooks.mask_reads_tensors else None)
        return out, lse

    if torch.is_grad_enabled() and any(x.requires_grad for x in (query, key, value)):
        plan = flex_backward.backward_plan(
            score_mod, block_mask, batch=batch, num_q_heads=num_q_heads, seqlen_q=seqlen_q,
            seqlen_k=seqlen_k, softmax_scale=scale, device=device)
        out, lse = flex_backward.FlexAttentionFunction.apply(query, key, value,
                                                             lambda: run(True), plan)
    else:
        out, lse = run(return_lse)
    return (out, lse) if return_lse else out


def attention_with_mods(q, k, v, out, lse, *, softmax_scale, score_mod, mask_mod, mod_args,
                        block_mask_tensors, q_descale, k_descale, v_descale,
                        score_linear: bool = False, mask_uses: frozenset | None = None) -> None:
    """The kernel entry point (module docstring). score_linear: translate_mods' flag (the
    kernels add such a score_mod as a term per row and one per key column). mask_uses: the
    index arguments mask_mod reads where it reads captured tensors too (ModHooks.mask_uses),
    else None: the Hopper kernel may then read its verdicts as bits (flex/mask_bits.py)."""
    if q.shape[1] == 0:
        return
    if k.shape[1] == 0:
        out.zero_()
        if lse is not None:
            lse.fill_(float("-inf"))
        return
    arch = arch_of(q.device)
    block_sizes = (None if block_mask_tensors is None else
                   (block_mask_tensors.q_block_size, block_mask_tensors.kv_block_size))
    descales = (q_descale, k_descale, v_descale)
    given_v = v
    transposes_v = v_needs_k_major(arch, v.dtype) and not fp8.is_k_major(v)
    if transposes_v:
        given_v = v.contiguous() if v.stride(0) == 0 else v
        v = fp8.k_major_like(given_v)    # filled once the kernel is chosen
    if dispatch.flex_kernel(arch, q, k, v, block_sizes, mask_mod, dispatch.current()) == "sm90":
        # A V copied here goes in grouped key order, as attention()'s (ops/attention.py).
        if transposes_v:
            v = fp8.k_major_copy(given_v, True, out=v)
        _sm90_forward(q, k, v, out, lse, softmax_scale, score_mod, mask_mod, mod_args,
                      block_mask_tensors, score_linear, descales, transposes_v, mask_uses)
        return
    if transposes_v:
        v = fp8.k_major_copy(given_v, out=v)
    config = fwd.config_for(arch, q.shape[3], v.shape[3], q.dtype in FP8_DTYPES)
    if block_mask_tensors is not None:
        config = dataclasses.replace(
            config, block_m=largest_tile(block_mask_tensors.q_block_size, config.block_m),
            block_n=largest_tile(block_mask_tensors.kv_block_size, config.block_n))
    masks = fwd.Masks(score_mod=score_mod, mask_mod=mask_mod, mod_args=tuple(mod_args),
                      block_mask=block_mask_tensors, score_linear=score_linear)
    fwd.attention_launch(q, k, v, out, lse, q_descale, k_descale, v_descale, softmax_scale,
                         False, arch, config, masks=masks).run()


def _sm90_forward(q, k, v, out, lse, softmax_scale, score_mod, mask_mod, mod_args,
                  block_mask_tensors, score_linear, descales, v_keys_grouped,
                  mask_uses) -> None:
    """attention_with_mods on the Hopper kernel (dispatch.flex_kernel chose it); descales:
    FP8's (q, k, v), v_keys_grouped: v is a grouped K-major copy."""
    from ..arch import num_sms
    from ..flex import mask_bits
    from ..flex.tile_plan import tile_plan
    from ..kernels.attention import sm90
    config = sm90.config_for(q.shape[3], v.shape[3], q.dtype in FP8_DTYPES)
    plan = bits = None
    if block_mask_tensors is not None:
        config = dataclasses.replace(
            config, block_n=largest_tile(block_mask_tensors.kv_block_size, config.block_n))
        batch, seqlen_q, num_q_heads, _ = q.shape
        plan = tile_plan(block_mask_tensors, batch=batch, num_q_heads=num_q_heads,
                         seqlen_q=seqlen_q, seqlen_k=k.shape[1], block_m=config.block_m,
                         num_programs=num_sms(q.device),
                         kv_bytes_per_key=(q.shape[3] + v.shape[3]) * q.element_size())
        if mask_bits.applies(mask_uses, block_mask_tensors, config.block_n):
            bits = mask_bits.build(mask_mod, tuple(mod_args), mask_uses, plan,
                                   block_mask_tensors, batch=batch, num_q_heads=num_q_heads,
                                   seqlen_q=seqlen_q, seqlen_k=k.shape[1],
                                   block_m=config.block_m)
    sm90.attention_sm90_launch(q, k, v, out, lse, softmax_scale, False, config=config,
                               block_plan=plan, score_mod=score_mod, mask_mod=mask_mod,
                               mod_args=tuple(mod_args), score_linear=score_linear,
                               q_descale=descales[0], k_descale=descales[1],
                               v_descale=descales[2], v_keys_grouped=v_keys_grouped,
                               mask_bits=bits).run()
