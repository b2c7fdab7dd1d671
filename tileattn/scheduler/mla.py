"""Split-KV plans for MLA decode: how each sequence's keys are cut into work items across the
SMs, and the workspace their partial results need (plain Python/torch, unit-tested on the CPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# Columns of a work item: batch, kv_start, kv_end, slot, and the seq_len the plan was made for.
WORK_FIELDS = 5


@dataclass
class MLAPlan:
    """How one batch's keys are cut into work items, and the workspace their results need.

    Depends only on seq_lens and shapes, so it is made once per batch layout and reused by
    every layer; mla_decode with a plan does no host synchronisation and no allocation (CUDA
    graph safe). A plan is valid for the seq_lens it was made from: mla_decode compares them
    on the host outside CUDA graph capture, and the kernels compare them on the device (NaN
    rows for a stale plan).
    """
    work: torch.Tensor          # int32 [num_work, WORK_FIELDS]: (batch, kv_start, kv_end, slot,
                                # seq_len); slot -1 means the sequence's only item, written
                                # straight to the output; seq_len is the length the plan was made
                                # for, which the kernels compare with the seq_lens they are given
    batch_slots: torch.Tensor  # int32 [batch + 1]: sequence b's partial results are slots
                                # batch_slots[b] ..< batch_slots[b + 1] (none for one item)
    partial_out: torch.Tensor  # float32 [max(num_slots, 1), q_len * num_heads, head_dim_v]
    partial_lse: torch.Tensor  # float32 [max(num_slots, 1), q_len * num_heads]
    batch: int
    num_heads: int
    q_len: int
    page_size: int
    kv_dtype: torch.dtype
    chunk_size: int             # keys per work item (the last of a sequence may have fewer)
    num_work: int
    num_slots: int
    max_seq_len: int
    total_keys: int = 0         # sum of seq_lens
    max_slots_per_seq: int = 0  # the most slots one sequence owns (0: every sequence has one item)
    config: Any = None          # the kernel config the chunks were sized for
    kernel: str = "triton"      # the partial kernel this plan runs (dispatch.mla_kernel)
    seq_lens: torch.Tensor | None = None  # int32 [batch]: the lengths it was made for


def mla_chunk_size(seq_lens: list[int], *, programs_per_item: int, num_sms: int,
                   block_n: int, min_chunk: int, max_items_per_seq: int | None = None,
                   capped_chunk_limit: int = 0) -> int:
    """Keys per work item: enough items for one wave over every SM, none shorter than min_chunk,
    and (with max_items_per_seq) no sequence cut into more items than that, unless that would
    take the chunk past capped_chunk_limit keys.

    Equal chunks keep mixed lengths balanced: a long sequence becomes many items of the same
    size as everyone else's, and the hardware scheduler hands them to idle SMs. Chunks are
    whole KV tiles so only a sequence's last tile needs bounds masks. The cap bounds the
    partial results a sequence writes and the combine reads back (rows x 512 fp32 per item).
    """
    total = sum(seq_lens)
    per_sm = -(-total * programs_per_item // num_sms)
    chunk = max(min_chunk, per_sm, 1)
    if max_items_per_seq:
        chunk = max(chunk, min(-(-max(seq_lens) // max_items_per_seq), capped_chunk_limit))
    return -(-chunk // block_n) * block_n


def split_mla_work(seq_lens: list[int], chunk_size: int) -> tuple[list[tuple[int, ...]], list[int]]:
    """(work items (batch, kv_start, kv_end, slot, seq_len), batch_slots) for sequences cut
    every chunk_size keys.

    Longest sequences first, so their many items start in the first wave.
    """
    order = sorted(range(len(seq_lens)), key=lambda b: (-seq_lens[b], b))
    counts = [-(-length // chunk_size) for length in seq_lens]
    batch_slots, next_slot = [0], 0
    for count in counts:
        next_slot += count if count > 1 else 0
        batch_slots.append(next_slot)
    work = []
    for b in order:
        for index, start in enumerate(range(0, seq_lens[b], chunk_size)):
            slot = batch_slots[b] + index if counts[b] > 1 else -1
            work.append((b, start, min(start + chunk_size, seq_lens[b]), slot, seq_lens[b]))
    return work, batch_slots


def make_mla_plan(seq_lens: list[int], *, num_heads: int, q_len: int, page_size: int,
                  kv_dtype: torch.dtype, head_dim_v: int, programs_per_item: int,
                  num_sms: int, block_n: int, min_chunk: int, device, config=None,
                  kernel: str = "triton",
                  max_items_per_seq: int | None = None, capped_chunk_limit: int = 0) -> MLAPlan:
    chunk = mla_chunk_size(seq_lens, programs_per_item=programs_per_item, num_sms=num_sms,
                           block_n=block_n, min_chunk=min_chunk,
                           max_items_per_seq=max_items_per_seq,
                           capped_chunk_limit=capped_chunk_limit)
    work, batch_slots = split_mla_work(seq_lens, chunk)
    num_slots = batch_slots[-1]
    num_rows = q_len * num_heads
    return MLAPlan(
        work=torch.tensor(work, dtype=torch.int32, device=device).reshape(-1, WORK_FIELDS),
        batch_slots=torch.tensor(batch_slots, dtype=torch.int32, device=device),
        partial_out=torch.empty((max(num_slots, 1), num_rows, head_dim_v), dtype=torch.float32,
                                 device=device),
        partial_lse=torch.empty((max(num_slots, 1), num_rows), dtype=torch.float32, device=device),
        batch=len(seq_lens), num_heads=num_heads, q_len=q_len, page_size=page_size,
        kv_dtype=kv_dtype, chunk_size=chunk, num_work=len(work), num_slots=num_slots,
        max_seq_len=max(seq_lens), total_keys=sum(seq_lens), config=config, kernel=kernel,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        max_slots_per_seq=max(b - a for a, b in zip(batch_slots, batch_slots[1:])),
    )
