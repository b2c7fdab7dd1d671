"""The MLA decode op: plans (split-KV work items, workspace and the kernel they run) and the
per-layer decode that runs what its plan says."""

from __future__ import annotations

import warnings

import torch

from .. import checks, dispatch
from ..arch import arch_of, num_sms
from ..kernels.mla import decode as mla_kernels
from ..kernels.runtime import on_device
from ..scheduler import MLAPlan, make_mla_plan


class PerformanceWarning(UserWarning):
    """A call that works but is known to be slower than an alternative the user controls."""


def make_plan(seq_lens, *, num_heads, q_len, page_size, kv_dtype, device, schedule, kernel):
    """mla_plan()'s implementation."""
    device = checks.mla_plan_args(seq_lens, num_heads, q_len, page_size, kv_dtype, device)
    if schedule is not None and schedule not in mla_kernels.SCHEDULES:
        raise ValueError(f"schedule must be one of {mla_kernels.SCHEDULES} or None, got {schedule!r}")
    settings = dispatch.current()
    if kernel is not None:
        settings = dispatch.Settings(attention=settings.attention, mla=kernel)
    lengths = seq_lens.tolist()
    checks.mla_lengths(lengths, q_len)
    arch = arch_of(device)
    num_rows = num_heads * q_len
    if kv_dtype == torch.float8_e4m3fn and dispatch.fp8_mla_cache_slower(arch, num_rows):
        warnings.warn(f"an FP8 MLA cache with num_heads * q_len = {num_rows} > 64 runs slower "
                      f"than a bf16 cache on {arch.name} today (README, MLA decode)",
                      PerformanceWarning, stacklevel=3)
    config = mla_kernels.config_for(arch, schedule, num_rows)
    chosen = dispatch.mla_kernel(arch, num_rows, page_size, kv_dtype, config.schedule, settings)
    return plan_for_config(lengths, config, num_heads=num_heads, q_len=q_len,
                           page_size=page_size, kv_dtype=kv_dtype, device=device, kernel=chosen)


def plan_for_config(lengths: list[int], config, *, num_heads, q_len, page_size, kv_dtype, device,
                    kernel="triton", max_splits_per_seq: int | None = None) -> MLAPlan:
    """The plan for checked arguments, a kernel config and a kernel (make_plan takes the chip's;
    the MLA benchmarks pass their candidates). max_splits_per_seq: the most work items per
    sequence (None: kernels/mla/decode.py's MAX_SPLITS_PER_SEQ; 0: no cap)."""
    if max_splits_per_seq is None:
        max_splits_per_seq = mla_kernels.MAX_SPLITS_PER_SEQ
    made = make_mla_plan(
        lengths, num_heads=num_heads, q_len=q_len, page_size=page_size, kv_dtype=kv_dtype,
        head_dim_v=mla_kernels.HEAD_DIM_NOPE,
        programs_per_item=mla_kernels.programs_per_work_item(config, num_heads * q_len),
        num_sms=num_sms(device) * config.programs_per_sm, block_n=config.block_n,
        min_chunk=config.min_chunk, device=device, config=config, kernel=kernel,
        max_items_per_seq=max_splits_per_seq or None,
        capped_chunk_limit=mla_kernels.SPLIT_CAP_MAX_CHUNK)
    if made.num_work > mla_kernels.MAX_WORK_ITEMS:
        raise ValueError(f"seq_lens holds {len(lengths)} sequences, which split into "
                         f"{made.num_work} work items; at most {mla_kernels.MAX_WORK_ITEMS} "
                         "fit one launch: split the batch")
    return made


def decode(q, kv_cache, page_table, seq_lens, *, softmax_scale, kv_descale, plan, return_lse,
           validate):
    """mla_decode()'s implementation."""
    checks.mla_inputs(q, kv_cache, page_table, seq_lens, kv_descale)
    scale = checks.positive_float("softmax_scale", softmax_scale)
    if validate is not None:
        checks.flag("validate", validate)
    batch, q_len, num_heads, _ = q.shape
    page_size = kv_cache.shape[1]
    capturing = q.is_cuda and torch.cuda.is_current_stream_capturing()
    if validate and capturing:
        raise ValueError("validate=True reads the page table on the host, which a CUDA graph "
                         "capture cannot do: pass validate=None (the default) or False there")
    host_checks = (plan is None or validate) if validate is not None else not capturing
    if host_checks:
        checks.pages(page_table, seq_lens, kv_cache.shape[0], page_size)
    if plan is None:
        plan = make_plan(seq_lens, num_heads=num_heads, q_len=q_len, page_size=page_size,
                         kv_dtype=kv_cache.dtype, device=q.device, schedule=None, kernel=None)
    _check_plan(plan, q, kv_cache, page_table, seq_lens, host_checks)

    out = torch.empty((batch, q_len, num_heads, mla_kernels.HEAD_DIM_NOPE), dtype=q.dtype,
                      device=q.device)
    # The kernels always write the LSE: the combine needs it and it is 2 KB per 512 outputs.
    lse = torch.empty((batch, q_len, num_heads), dtype=torch.float32, device=q.device)
    with on_device(q.device):
        for launch in mla_kernels.mla_decode_launches(q, kv_cache, page_table, seq_lens,
                                                      kv_descale, out, lse, plan, scale,
                                                      arch_of(q.device), plan.kernel):
            launch.run()
    return (out, lse) if return_lse else out


def _check_plan(plan, q, kv_cache, page_table, seq_lens, host_checks: bool) -> None:
    """A plan knows what it was made for. Shapes, dtype and device are compared always; the
    seq_lens values on the host where host_checks (outside CUDA graph capture by default); the
    kernels compare them on the device too and write NaN rows for a stale plan."""
    if not isinstance(plan, MLAPlan):
        raise TypeError(f"plan must come from tileattn.mla_plan, got {type(plan).__name__}")
    batch, q_len, num_heads, _ = q.shape
    made_for = (plan.batch, plan.q_len, plan.num_heads, plan.page_size, plan.kv_dtype)
    given = (batch, q_len, num_heads, kv_cache.shape[1], kv_cache.dtype)
    if made_for != given:
        raise ValueError("plan was made for (batch, q_len, num_heads, page_size, kv_dtype) = "
                         f"{made_for}, but the inputs have {given}")
    if plan.work.device != q.device:
        raise ValueError(f"plan is on {plan.work.device} but q is on {q.device}")
    page_size = kv_cache.shape[1]
    if plan.max_seq_len > page_table.shape[1] * page_size:
        raise ValueError(f"seq_lens up to {plan.max_seq_len} (from the plan) exceed page_table's "
                         f"capacity {page_table.shape[1]} pages x {page_size}")
    if host_checks and not torch.equal(plan.seq_lens, seq_lens):
        raise ValueError("plan was made for other seq_lens than the ones given (a plan is "
                         "valid for one decode step: make a new one with tileattn.mla_plan "
                         "when the lengths change)")
    if plan.kernel == "gluon":
        from ..kernels.mla import sm90
        sm90.check_inputs(q, kv_cache)


# A plan's fields beyond its tensors, as the tileattn::mla_decode custom op carries them.
_KERNELS = ("triton", "gluon")


def plan_fields(plan: MLAPlan) -> list[int]:
    return [plan.chunk_size, plan.num_work, plan.num_slots, plan.max_seq_len, plan.total_keys,
            plan.max_slots_per_seq, _KERNELS.index(plan.kernel),
            mla_kernels.SCHEDULES.index(plan.config.schedule)]


def plan_from_fields(q, kv_cache, seq_lens, work, batch_slots, partial_out, partial_lse,
                     fields: list[int]) -> MLAPlan:
    """The plan plan_fields() encoded (its config is the chip's row for its schedule)."""
    (chunk_size, num_work, num_slots, max_seq_len, total_keys, max_slots_per_seq, kernel,
     schedule) = fields
    batch, q_len, num_heads, _ = q.shape
    config = mla_kernels.config_for(arch_of(q.device), mla_kernels.SCHEDULES[schedule],
                                    num_heads * q_len)
    return MLAPlan(work=work, batch_slots=batch_slots, partial_out=partial_out,
                   partial_lse=partial_lse, batch=batch, num_heads=num_heads, q_len=q_len,
                   page_size=kv_cache.shape[1], kv_dtype=kv_cache.dtype, chunk_size=chunk_size,
                   num_work=num_work, num_slots=num_slots, max_seq_len=max_seq_len,
                   total_keys=total_keys, max_slots_per_seq=max_slots_per_seq, config=config,
                   kernel=_KERNELS[kernel], seq_lens=_planned_lengths(work, batch))


def _planned_lengths(work: torch.Tensor, batch: int) -> torch.Tensor:
    """The seq_lens a plan was made for, from its work items' fifth column (every sequence
    has at least one item)."""
    lengths = torch.zeros(batch, dtype=torch.int32, device=work.device)
    return lengths.scatter_reduce(0, work[:, 0].long(), work[:, 4], reduce="amax")
