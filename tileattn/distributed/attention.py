"""Ring attention: each rank keeps its queries, the K/V blocks travel around the group.

Forward, W ranks: at step s rank r holds the K/V block of rank (r - s) mod W; it posts the
exchange that brings the next block before computing the current one (so the transfer runs
under the kernel), calls tileattn.attention on the part of the block its queries see
(layout.block_task) with an fp32 output and its LSE, and merges the partial results by LSE in
fp32 (ring.merge_into). The output is rounded to its dtype once, at the end.

Backward (FlashAttention's composition over key blocks): the K/V blocks travel the same way
again; at each step block_backward gives this rank's dq terms, kept locally, and the block's
dk/dv terms, added to the block's fp32 gradient accumulators, which follow the block one step
behind, so that after W steps each accumulator has visited every rank and arrives at the
block's owner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import api, fp8
from .. import checks as attention_checks
from ..arch import FP8_DTYPES, arch_of, v_needs_k_major
from . import checks
from .block_backward import block_backward
from .layout import LAYOUTS, block_task, chunks_per_rank
from .ring import Ring, dense, merge_into

# Tags of the two exchanges that can be in flight at once (backward: K/V and their gradients).
_KV_TAG = 0
_GRADIENT_TAG = 8


@dataclass(frozen=True)
class RingPlan:
    """What every step of one call needs besides the tensors."""
    ring: Ring
    layout: str
    causal: bool
    softmax_scale: float


def attention(q, k, v, *, group=None, layout="zigzag", causal=False, softmax_scale=None,
              q_descale=None, k_descale=None, v_descale=None, return_lse=False):
    """Context-parallel attention over the ranks of `group`: tileattn.attention on the full
    sequence, computed from this rank's shard of it.

    q [B, S/W, Hq, D], k [B, S/W, Hkv, D], v [B, S/W, Hkv, Dv]: this rank's shards, as
    tileattn.distributed.shard(full, layout=layout) makes them (equal lengths on every rank;
    dtypes, head dims and GQA as tileattn.attention takes them). causal is the causal mask of
    the full sequence. FP8 descales ([] or [B, heads], float32) may differ per rank: each K/V
    block travels with its own. Returns this rank's rows of the full output [B, S/W, Hq, Dv]
    (bf16 for FP8 inputs, else the input dtype) and, with return_lse=True, their lse
    [B, Hq, S/W] fp32 (natural log).

    Every rank of the group must call it with the same shapes, dtypes, flags and layout;
    arguments that are wrong on any rank raise the same ValueError/TypeError on every rank
    (one small all-gather checks them; on a group without a CPU backend it synchronises the
    host with the GPU). Differentiable for fp16/bf16 inputs (the backward pass is a ring too,
    so every rank must run it); lse carries no gradient.
    """
    group, rank, world_size = checks.group_and_size(group)
    needs_grad = torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in (q, k, v))
    _check_collectively(group, rank, world_size, q, k, v, q_descale, k_descale, v_descale,
                        causal, layout, softmax_scale, needs_grad)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[3])
    plan = RingPlan(Ring(group, rank, world_size), layout, causal, float(softmax_scale))
    if needs_grad:
        out, lse = _RingAttention.apply(q, k, v, plan)
    else:
        out, lse = ring_forward(q, k, v, q_descale, k_descale, v_descale, plan)
    return (out, lse) if return_lse else out


def _check_collectively(group, rank, world_size, q, k, v, q_descale, k_descale, v_descale,
                        causal, layout, softmax_scale, needs_grad) -> None:
    description = checks.Description()
    for name, x in (("q", q), ("k", k), ("v", v), ("q_descale", q_descale),
                    ("k_descale", k_descale), ("v_descale", v_descale)):
        description.tensor(name, x)
    description.flag("causal", causal)
    description.choice("layout", layout, LAYOUTS)
    description.number("softmax_scale", softmax_scale)
    description.flag("whether q, k or v requires grad", needs_grad)
    try:
        _check_local(group, world_size, q, k, v, q_descale, k_descale, v_descale, causal,
                     layout, softmax_scale, needs_grad)
        error = None
    except Exception as raised:  # noqa: BLE001 (every rank must learn of it, whatever it is)
        error = raised
    checks.agree(group, rank, world_size, description, error,
                 checks.exchange_device(group, q), "attention")


def _check_local(group, world_size, q, k, v, q_descale, k_descale, v_descale, causal, layout,
                 softmax_scale, needs_grad) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    # First whether the group can move these tensors at all (the likelier mistake in a ring:
    # CPU tensors on an NCCL group, CUDA ones on gloo), then tileattn.attention's own checks;
    # grad is handled here, by the ring's backward.
    if world_size > 1 and isinstance(q, torch.Tensor):
        error = checks.point_to_point_error(str(torch.distributed.get_backend(group)),
                                            q.device.type)
        if error is not None:
            raise ValueError(f"q, k and v are on {q.device}, but {error}")
    tensors = [x.detach() if isinstance(x, torch.Tensor) else x
               for x in (q, k, v, q_descale, k_descale, v_descale)]
    attention_checks.attention_inputs(*tensors[:3], causal, *tensors[3:], None)
    attention_checks.softmax_scale(softmax_scale, q.shape[3])
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"q and k/v must hold the same number of local positions (the same "
                         f"shard of one sequence), got q {q.shape[1]}, k {k.shape[1]}")
    chunks = chunks_per_rank(layout)
    if q.shape[1] % chunks:
        raise ValueError(f"a {layout} shard holds {chunks} equal chunks of the sequence, so its "
                         f"length must be a multiple of {chunks}, got {q.shape[1]} "
                         "(make shards with tileattn.distributed.shard)")
    attention_checks.no_grad("distributed.attention", q_descale=q_descale, k_descale=k_descale,
                      v_descale=v_descale)
    if needs_grad and q.dtype in FP8_DTYPES:
        raise ValueError(f"q, k or v requires grad, but there is no backward pass for {q.dtype} "
                         "inputs: call under torch.no_grad() or pass detached tensors")


def _kernel_ready_v(v: torch.Tensor) -> torch.Tensor:
    """V in the layout the chip's kernel reads (FP8 on sm89/sm90: K-major), made once here so
    that it travels in that layout instead of being transposed at every step."""
    if v.is_cuda and v_needs_k_major(arch_of(v.device), v.dtype) and not fp8.is_k_major(v):
        return fp8.prepare_v(v)
    return v


def ring_forward(q, k, v, q_descale, k_descale, v_descale, plan: RingPlan):
    """(out in the output dtype, lse fp32) for checked local shards."""
    ring, local_len = plan.ring, q.shape[1]
    has_k_descale, has_v_descale = k_descale is not None, v_descale is not None
    block = [dense(k), dense(_kernel_ready_v(v))]
    block += [d for d in (k_descale, v_descale) if d is not None]
    out = lse = None
    for step in range(ring.world_size):
        next_block = ring.pass_along(block, _KV_TAG) if step + 1 < ring.world_size else None
        task = block_task(plan.layout, plan.causal, ring.rank, ring.source(step), local_len)
        if task is not None:
            k_block, v_block = block[0][:, task.k_rows], block[1][:, task.k_rows]
            extra = iter(block[2:])
            block_out, block_lse = api.attention(
                q[:, task.q_rows], k_block, v_block, causal=task.causal,
                softmax_scale=plan.softmax_scale, q_descale=q_descale,
                k_descale=next(extra) if has_k_descale else None,
                v_descale=next(extra) if has_v_descale else None,
                out_dtype=torch.float32, return_lse=True)
            if out is None:  # step 0: the rank's own block, which every local row sees
                out, lse = block_out, block_lse
            else:
                merge_into(out[:, task.q_rows], lse[:, :, task.q_rows], block_out, block_lse)
        if next_block is not None:
            block = next_block.wait()
    out_dtype = torch.bfloat16 if q.dtype in FP8_DTYPES else q.dtype
    return out.to(out_dtype), lse


def ring_backward(dout, q, k, v, out, lse, plan: RingPlan):
    """(dq, dk, dv) of this rank's shards, in their dtypes, from the merged out and lse."""
    ring, local_len = plan.ring, q.shape[1]
    passes = ring.world_size > 1
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    block = [dense(k), dense(v)]
    gradients = None  # the block's [dk, dv] fp32 accumulators, or their exchange in flight
    for step in range(ring.world_size):
        next_block = ring.pass_along(block, _KV_TAG) if step + 1 < ring.world_size else None
        task = block_task(plan.layout, plan.causal, ring.rank, ring.source(step), local_len)
        if task is not None:
            rows, keys = task.q_rows, task.k_rows
            block_dq, block_dk, block_dv = block_backward(
                dout[:, rows], q[:, rows], block[0][:, keys], block[1][:, keys], out[:, rows],
                lse[:, :, rows], causal=task.causal, softmax_scale=plan.softmax_scale)
            dq[:, rows] += block_dq
        if step == 0:
            gradients = [torch.zeros(x.shape, dtype=torch.float32, device=x.device)
                         for x in (k, v)]
        else:
            gradients = gradients.wait()  # sent by the previous rank, which held this block
        if task is not None:
            gradients[0][:, keys] += block_dk
            gradients[1][:, keys] += block_dv
        if passes:  # to the next rank, which holds this block next (or owns it, after step W-1)
            gradients = ring.pass_along(gradients, _GRADIENT_TAG)
        if next_block is not None:
            block = next_block.wait()
    dk, dv = gradients.wait() if passes else gradients
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    """Differentiable ring attention (fp16/bf16; checked inputs). lse is not differentiable,
    as in FlashAttention and SDPA."""

    @staticmethod
    def forward(ctx, q, k, v, plan: RingPlan):
        out, lse = ring_forward(q, k, v, None, None, None, plan)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan = plan
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, _lse_grad):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(dout, q, k, v, out, lse, ctx.plan)
        return dq, dk, dv, None
