"""MLA decode combine: merges the split-KV partial results of each sequence by their LSEs.

Where the split-KV plan (tileattn.scheduler) gives a sequence several work items, the partial
kernel (Triton's in mla_decode.py or Gluon's in mla_sm90.py) writes each item's normalised
fp32 output and LSE to a workspace slot; mla_decode_combine_kernel merges a sequence's slots
into its final output and LSE, one program per (sequence, block of BLOCK_R rows). The partial
kernel wrote sequences with a single work item directly. mla_decode.mla_decode_launches
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

from .cross_compile import KernelLaunch


@triton.jit
def mla_decode_combine_kernel(
    partial_out_ptr, partial_lse_ptr, batch_slots_ptr, out_ptr, lse_ptr,
    stride_ob, stride_os, stride_oh,
    num_heads, num_rows,
    BLOCK_R: tl.constexpr,
):
    batch = tl.program_id(0)
    slot_start = tl.load(batch_slots_ptr + batch)
    slot_end = tl.load(batch_slots_ptr + batch + 1)
    # Sequences with a single work item were written by the partial kernel already.
    if slot_end > slot_start:
        offs_r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
        row_valid = offs_r < num_rows
        offs_d = tl.arange(0, 512)
        m_i = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
        acc = tl.zeros([BLOCK_R, 512], dtype=tl.float32)
        for slot in range(slot_start, slot_end):
            # slot · num_rows fits int32; the ×512 below needs int64.
            slot_rows = offs_r.to(tl.int64) + slot * num_rows
            lse_s = tl.load(partial_lse_ptr + slot_rows, mask=row_valid, other=float("-inf"))
            out_s = tl.load(partial_out_ptr + slot_rows[:, None] * 512 + offs_d[None, :],
                            mask=row_valid[:, None], other=0.0)
            m_new = tl.maximum(m_i, lse_s)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_safe)
            weight = tl.exp(lse_s - m_safe)
            acc = acc * alpha[:, None] + out_s * weight[:, None]
            l_i = l_i * alpha + weight
            m_i = m_new
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        token = offs_r // num_heads
        head = offs_r % num_heads
        out_ptrs = (out_ptr + batch.to(tl.int64) * stride_ob + token.to(tl.int64)[:, None] * stride_os
                    + head.to(tl.int64)[:, None] * stride_oh + offs_d[None, :])
        tl.store(out_ptrs, (acc / l_safe[:, None]).to(out_ptr.dtype.element_ty),
                 mask=row_valid[:, None])
        tl.store(lse_ptr + batch.to(tl.int64) * num_rows + offs_r, m_i + tl.log(l_safe),
                 mask=row_valid)


COMBINE_ROWS = 16


def combine_launches(q, out, lse, plan) -> list[KernelLaunch]:
    """The combine launch where some sequence has several work items (none otherwise)."""
    batch, q_len, num_heads, _ = q.shape
    num_rows = q_len * num_heads
    launches = []
    if plan.num_slots > 0:
        combine_args = dict(
            partial_out_ptr=plan.partial_out, partial_lse_ptr=plan.partial_lse,
            batch_slots_ptr=plan.batch_slots, out_ptr=out, lse_ptr=lse,
            stride_ob=out.stride(0), stride_os=out.stride(1), stride_oh=out.stride(2),
            num_heads=num_heads, num_rows=num_rows)
        launches.append(KernelLaunch(mla_decode_combine_kernel,
                                     (batch, -(-num_rows // COMBINE_ROWS)), combine_args,
                                     dict(BLOCK_R=COMBINE_ROWS), 4, 1))
    return launches
