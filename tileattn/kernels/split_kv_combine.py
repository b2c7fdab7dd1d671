"""Split-KV combine: merges the split-KV partial results of each sequence by their LSEs.

Where a split-KV plan gives a sequence several work items, the partial kernel (MLA: Triton's
in mla_decode.py or Gluon's in mla_sm90.py; GQA decode: decode.py) writes each item's
normalised fp32 output and LSE to a workspace slot; mla_decode_combine_kernel merges a
sequence's slots into its final output and LSE, one program per (sequence, BLOCK_R rows,
BLOCK_D columns). The partial kernel wrote sequences with a single work item directly.
mla_decode.mla_decode_launches appends combine_launches to the partial launch;
decode.decode_launches calls split_kv_combine_launch.

Pointer layouts (element strides; num_rows = q_len · num_heads, row r is token r // num_heads,
head r % num_heads; q_len is the most queries a sequence has):
    partial_out   float32 [num_slots, num_rows, HEAD_DIM_V] contiguous
    partial_lse   float32 [num_slots, num_rows]     contiguous, natural log
    batch_slots   int32 [batch + 1]                 sequence b owns slots [batch_slots[b], batch_slots[b+1])
    cu_seqlens_q  int32 [batch + 1] or None         varlen queries: sequence b's token j is
                                                    query cu_seqlens_q[b] + j, and it has
                                                    cu_seqlens_q[b+1] - cu_seqlens_q[b] tokens
    out           token (b, j), head h at b * stride_ob + (q_start + j) * stride_os + h * stride_oh,
                  last dim contiguous (q_start = cu_seqlens_q[b], or 0 without it).
                  MLA: [batch, q_len, num_heads, 512]; decode: [total_q, num_heads, head_dim_v]
    lse           float32, likewise through stride_lse_b/s/h, natural log; None: not written.
                  MLA: [batch, q_len, num_heads] contiguous; decode: [num_heads, total_q]
"""

from __future__ import annotations

import triton
import triton.language as tl

from .runtime import KernelLaunch


@triton.jit
def _step_lse(partial_lse_ptr, first, slot_end, offs_s, offs_r, row_valid, num_rows):
    """Slots first + offs_s (those before slot_end) x rows offs_r: their workspace row indices
    (int64: times HEAD_DIM_V they overflow int32), the valid mask and the LSEs (-inf where
    not valid)."""
    slots = first + offs_s
    valid = (slots < slot_end)[:, None] & row_valid[None, :]
    slot_rows = slots.to(tl.int64)[:, None] * num_rows + offs_r[None, :]
    lse_s = tl.load(partial_lse_ptr + slot_rows, mask=valid, other=float("-inf"))
    return slot_rows, valid, lse_s


@triton.jit
def mla_decode_combine_kernel(
    partial_out_ptr, partial_lse_ptr, batch_slots_ptr, cu_seqlens_q_ptr, out_ptr, lse_ptr,
    stride_ob, stride_os, stride_oh, stride_lse_b, stride_lse_s, stride_lse_h,
    num_heads, num_rows,
    HEAD_DIM_V: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
    SLOTS_PER_STEP: tl.constexpr, ONE_STEP: tl.constexpr,
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
        q_start = 0
        if cu_seqlens_q_ptr is not None:
            # Sequences may have fewer tokens than q_len: the rows past theirs are not theirs.
            q_start = tl.load(cu_seqlens_q_ptr + batch)
            q_count = tl.load(cu_seqlens_q_ptr + batch + 1) - q_start
            row_valid = row_valid & (offs_r // num_heads < q_count)
        offs_d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
        column_valid = offs_d < HEAD_DIM_V
        offs_s = tl.arange(0, SLOTS_PER_STEP)
        if ONE_STEP:
            # Every sequence has at most SLOTS_PER_STEP slots: both loads are issued at once
            # and the largest LSE comes from the same registers.
            slot_rows, valid, lse_s = _step_lse(partial_lse_ptr, slot_start, slot_end, offs_s,
                                                offs_r, row_valid, num_rows)
            out_s = tl.load(partial_out_ptr + slot_rows[:, :, None] * HEAD_DIM_V + offs_d[None, None, :],
                            mask=valid[:, :, None] & column_valid[None, None, :], other=0.0)
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
                out_s = tl.load(partial_out_ptr + slot_rows[:, :, None] * HEAD_DIM_V
                                + offs_d[None, None, :],
                                mask=valid[:, :, None] & column_valid[None, None, :], other=0.0)
                acc += tl.sum(out_s * weight[:, :, None], axis=0)
                l_i += tl.sum(weight, axis=0)
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        token = (q_start + offs_r // num_heads).to(tl.int64)
        head = (offs_r % num_heads).to(tl.int64)
        out_ptrs = (out_ptr + batch.to(tl.int64) * stride_ob + token[:, None] * stride_os
                    + head[:, None] * stride_oh + offs_d[None, :])
        tl.store(out_ptrs, (acc / l_safe[:, None]).to(out_ptr.dtype.element_ty),
                 mask=row_valid[:, None] & column_valid[None, :])
        if lse_ptr is not None:
            if tl.program_id(2) == 0:
                tl.store(lse_ptr + batch.to(tl.int64) * stride_lse_b + token * stride_lse_s
                         + head * stride_lse_h, m_i + tl.log(l_safe), mask=row_valid)


# Tile of one combine program: 16 rows x 32 columns with up to 64 slots a step on 4 warps was
# fastest or tied at every plan swept; wider blocks and 8 warps hold more values a thread and
# ran slower (docs/design.md, "Combine").
COMBINE_ROWS = 16
COMBINE_COLUMNS = 32      # 16 programs per row block share MLA's 512 output columns
COMBINE_MAX_SLOTS_PER_STEP = 64
COMBINE_WARPS = 4


def combine_launches(q, out, lse, plan, *, rows: int = COMBINE_ROWS,
                     columns: int = COMBINE_COLUMNS, max_slots_per_step: int = COMBINE_MAX_SLOTS_PER_STEP,
                     num_warps: int = COMBINE_WARPS) -> list[KernelLaunch]:
    """MLA's combine launch where some sequence has several work items (none otherwise).
    The keyword arguments are for tuning runs (benchmarks/mla_combine_sweep.py)."""
    batch, q_len, num_heads, _ = q.shape
    if plan.num_slots == 0:
        return []
    return [split_kv_combine_launch(
        plan, out, lse, batch=batch, num_heads=num_heads, q_len=q_len, head_dim_v=out.shape[3],
        out_strides=(out.stride(0), out.stride(1), out.stride(2)),
        lse_strides=(q_len * num_heads, num_heads, 1), rows=rows, columns=columns,
        max_slots_per_step=max_slots_per_step, num_warps=num_warps)]


def split_kv_combine_launch(plan, out, lse, *, batch: int, num_heads: int, q_len: int,
                            head_dim_v: int, out_strides: tuple[int, int, int],
                            lse_strides: tuple[int, int, int], cu_seqlens_q=None,
                            rows: int = COMBINE_ROWS, columns: int = COMBINE_COLUMNS,
                            max_slots_per_step: int = COMBINE_MAX_SLOTS_PER_STEP,
                            num_warps: int = COMBINE_WARPS) -> KernelLaunch:
    """The combine launch for a plan with slots (plan.num_slots > 0): plan.partial_out,
    partial_lse, batch_slots, num_slots and max_slots_per_seq are read. Strides (per sequence,
    per token, per head) address out and lse as the module docstring says; lse may be None.
    A step takes the plan's most slots per sequence, rounded up to a power of two, up to
    max_slots_per_step; where that covers every sequence the kernel makes one pass (ONE_STEP)."""
    num_rows = q_len * num_heads
    combine_args = dict(
        partial_out_ptr=plan.partial_out, partial_lse_ptr=plan.partial_lse,
        batch_slots_ptr=plan.batch_slots, cu_seqlens_q_ptr=cu_seqlens_q, out_ptr=out,
        lse_ptr=lse, stride_ob=out_strides[0], stride_os=out_strides[1],
        stride_oh=out_strides[2], stride_lse_b=lse_strides[0], stride_lse_s=lse_strides[1],
        stride_lse_h=lse_strides[2], num_heads=num_heads, num_rows=num_rows)
    most = plan.max_slots_per_seq or plan.num_slots   # num_slots bounds it
    slots = min(max_slots_per_step, 1 << (most - 1).bit_length())
    grid = (batch, -(-num_rows // rows), -(-head_dim_v // columns))
    return KernelLaunch(mla_decode_combine_kernel, grid, combine_args,
                        dict(HEAD_DIM_V=head_dim_v, BLOCK_R=rows, BLOCK_D=columns,
                             SLOTS_PER_STEP=slots, ONE_STEP=most <= slots),
                        num_warps, 1)
