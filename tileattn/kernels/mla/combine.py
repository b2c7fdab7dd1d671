"""MLA decode combine: merges the split-KV partial results of each sequence by their LSEs.

Where the split-KV plan (tileattn.scheduler) gives a sequence several work items, the partial
kernel (Triton's in decode.py or Gluon's in sm90.py / sm90_fp8.py) writes each item's normalised
fp32 output and LSE to a workspace slot; mla_decode_combine_kernel merges a sequence's slots
into its final output and LSE, one program per (sequence, BLOCK_R rows, BLOCK_D columns). The partial
kernel wrote sequences with a single work item directly. decode.mla_decode_launches
appends combine_launches to the partial launch.

Pointer layouts (element strides; num_rows = q_len · num_heads, row r is token r // num_heads,
head r % num_heads):
    partial_out   float32 [num_slots, num_rows, 512] contiguous
    partial_lse   float32 [num_slots, num_rows]     contiguous, natural log
    batch_slots   int32 [batch + 1]                 sequence b owns slots [batch_slots[b], batch_slots[b+1])
    out           [batch, q_len, num_heads, 512]    last dim contiguous
    lse           float32 [batch, q_len, num_heads] contiguous, natural log
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..runtime import KernelLaunch


@triton.jit
def _step_lse(partial_lse_ptr, first, slot_end, offs_s, offs_r, row_valid, num_rows):
    """Slots first + offs_s (those before slot_end) x rows offs_r: their workspace row indices
    (int64: the x512 of partial_out overflows int32), the valid mask and the LSEs (-inf where
    not valid)."""
    slots = first + offs_s
    valid = (slots < slot_end)[:, None] & row_valid[None, :]
    slot_rows = slots.to(tl.int64)[:, None] * num_rows + offs_r[None, :]
    lse_s = tl.load(partial_lse_ptr + slot_rows, mask=valid, other=float("-inf"))
    return slot_rows, valid, lse_s


@triton.jit
def mla_decode_combine_kernel(
    partial_out_ptr, partial_lse_ptr, batch_slots_ptr, out_ptr, lse_ptr,
    stride_ob, stride_os, stride_oh,
    num_heads, num_rows,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, SLOTS_PER_STEP: tl.constexpr,
    ONE_STEP: tl.constexpr,
):
    """Program (sequence, BLOCK_R rows, BLOCK_D output columns). With ONE_STEP (every
    sequence has at most SLOTS_PER_STEP slots) one pass loads all slots' LSEs and outputs at
    once; otherwise two passes over the slots, SLOTS_PER_STEP at a time: the rows' largest
    LSE, then the weighted sum. Loads of one step are independent, so a sequence split 64 ways
    is not 64 dependent load latencies; a step sized to the plan (not a fixed 16) wastes no
    masked loads on sequences with few slots (docs/design.md, "Combine")."""
    batch = tl.program_id(0)
    slot_start = tl.load(batch_slots_ptr + batch)
    slot_end = tl.load(batch_slots_ptr + batch + 1)
    # Sequences with a single work item were written by the partial kernel already.
    if slot_end > slot_start:
        offs_r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
        row_valid = offs_r < num_rows
        offs_d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
        offs_s = tl.arange(0, SLOTS_PER_STEP)
        if ONE_STEP:
            # Every sequence has at most SLOTS_PER_STEP slots: both loads are issued at once
            # and the largest LSE comes from the same registers.
            slot_rows, valid, lse_s = _step_lse(partial_lse_ptr, slot_start, slot_end, offs_s,
                                                offs_r, row_valid, num_rows)
            out_s = tl.load(partial_out_ptr + slot_rows[:, :, None] * 512 + offs_d[None, None, :],
                            mask=valid[:, :, None], other=0.0)
            m_i = tl.max(lse_s, axis=0)
            m_safe = tl.where(m_i == float("-inf"), 0.0, m_i)
            weight = tl.exp(lse_s - m_safe[None, :])
            acc = tl.sum(out_s * weight[:, :, None], axis=0)
            l_i = tl.sum(weight, axis=0)
        else:
            m_i = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
            for first in range(slot_start, slot_end, SLOTS_PER_STEP):
                _, _, lse_s = _step_lse(partial_lse_ptr, first, slot_end, offs_s, offs_r,
                                        row_valid, num_rows)
                m_i = tl.maximum(m_i, tl.max(lse_s, axis=0))
            m_safe = tl.where(m_i == float("-inf"), 0.0, m_i)
            acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
            l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
            for first in range(slot_start, slot_end, SLOTS_PER_STEP):
                slot_rows, valid, lse_s = _step_lse(partial_lse_ptr, first, slot_end, offs_s,
                                                    offs_r, row_valid, num_rows)
                weight = tl.exp(lse_s - m_safe[None, :])
                out_s = tl.load(partial_out_ptr + slot_rows[:, :, None] * 512 + offs_d[None, None, :],
                                mask=valid[:, :, None], other=0.0)
                acc += tl.sum(out_s * weight[:, :, None], axis=0)
                l_i += tl.sum(weight, axis=0)
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        token = offs_r // num_heads
        head = offs_r % num_heads
        out_ptrs = (out_ptr + batch.to(tl.int64) * stride_ob + token.to(tl.int64)[:, None] * stride_os
                    + head.to(tl.int64)[:, None] * stride_oh + offs_d[None, :])
        tl.store(out_ptrs, (acc / l_safe[:, None]).to(out_ptr.dtype.element_ty),
                 mask=row_valid[:, None])
        if tl.program_id(2) == 0:
            tl.store(lse_ptr + batch.to(tl.int64) * num_rows + offs_r, m_i + tl.log(l_safe),
                     mask=row_valid)


# Tile of one combine program: 16 rows x 32 columns with up to 64 slots a step on 4 warps was
# fastest or tied at every plan swept; wider blocks and 8 warps hold more values a thread and
# ran slower (docs/design.md, "Combine").
COMBINE_ROWS = 16
COMBINE_COLUMNS = 32      # 16 programs per row block share the 512 output columns
COMBINE_MAX_SLOTS_PER_STEP = 64
COMBINE_WARPS = 4


def combine_launches(q, out, lse, plan, *, rows: int = COMBINE_ROWS,
                     columns: int = COMBINE_COLUMNS, max_slots_per_step: int = COMBINE_MAX_SLOTS_PER_STEP,
                     num_warps: int = COMBINE_WARPS) -> list[KernelLaunch]:
    """The combine launch where some sequence has several work items (none otherwise). A step
    takes the plan's most slots per sequence, rounded up to a power of two, up to
    max_slots_per_step; where that covers every sequence the kernel makes one pass (ONE_STEP).
    The keyword arguments are for tuning runs (benchmarks/mla_combine_sweep.py)."""
    batch, q_len, num_heads, _ = q.shape
    num_rows = q_len * num_heads
    launches = []
    if plan.num_slots > 0:
        combine_args = dict(
            partial_out_ptr=plan.partial_out, partial_lse_ptr=plan.partial_lse,
            batch_slots_ptr=plan.batch_slots, out_ptr=out, lse_ptr=lse,
            stride_ob=out.stride(0), stride_os=out.stride(1), stride_oh=out.stride(2),
            num_heads=num_heads, num_rows=num_rows)
        most = plan.max_slots_per_seq or plan.num_slots   # num_slots bounds it
        slots = min(max_slots_per_step, 1 << (most - 1).bit_length())
        grid = (batch, -(-num_rows // rows), 512 // columns)
        launches.append(KernelLaunch(mla_decode_combine_kernel, grid, combine_args,
                                     dict(BLOCK_R=rows, BLOCK_D=columns, SLOTS_PER_STEP=slots,
                                          ONE_STEP=most <= slots),
                                     num_warps, 1))
    return launches
