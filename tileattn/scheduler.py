"""Work plans, in plain Python/torch so they can be unit-tested on the CPU.

Two families live here:
  * persistent tile order for prefill attention (one program per SM walks a list of tiles);
  * split-KV plans for MLA decode (how each sequence's keys are cut across SMs).
"""

from __future__ import annotations

import functools

import torch

# ---- persistent prefill tile order --------------------------------------------------------

@functools.lru_cache(maxsize=256)
def _prefill_tile_order_cached(num_m_blocks: int, num_batch_heads: int, causal: bool,
                               num_programs: int, device: str) -> torch.Tensor:
    order = prefill_tile_order_list(num_m_blocks, num_batch_heads, causal, num_programs)
    return torch.tensor(order, dtype=torch.int32, device=device)


def prefill_tile_order_list(num_m_blocks: int, num_batch_heads: int, causal: bool,
                            num_programs: int) -> list[int]:
    """The work list of a persistent prefill kernel, as tile ids m_block + num_m_blocks * bh.

    Program p runs items p, p + P, p + 2P, ... (P = num_programs); items [kP, (k+1)P) form
    "wave" k, which runs roughly concurrently across the GPU.
      * non-causal: every tile costs the same; tiles of one (batch, head) are adjacent so a
        wave's programs share K/V in L2;
      * causal: a tile's cost grows with m_block; tiles go longest first (LPT), and the waves
        alternate direction (snake) so the program that got the longest tile of one wave gets
        the shortest of the next. Bound (tests/test_scheduler.py): the busiest and the idlest
        program differ by at most one tile's cost.
    """
    if not causal:
        return list(range(num_m_blocks * num_batch_heads))
    by_length = [m + num_m_blocks * bh for m in reversed(range(num_m_blocks))
                 for bh in range(num_batch_heads)]
    order = []
    for wave, start in enumerate(range(0, len(by_length), num_programs)):
        chunk = by_length[start:start + num_programs]
        if wave % 2 == 1:
            chunk = chunk[::-1]  # program p takes the (P-1-p)-th longest tile of this wave
        order.extend(chunk)
    return order


def prefill_tile_order(num_m_blocks: int, num_batch_heads: int, causal: bool,
                       num_programs: int, device) -> torch.Tensor:
    """prefill_tile_order_list as an int32 tensor on `device`, built once per shape."""
    return _prefill_tile_order_cached(num_m_blocks, num_batch_heads, causal, num_programs,
                                      str(device))


# ---- MLA decode split-KV plans ------------------------------------------------------------
# Imported here rather than at the top: the sections above and below are edited separately.
from dataclasses import dataclass as _dataclass
from typing import Any as _Any

import torch as _torch


@_dataclass
class MLAPlan:
    """How one batch's keys are cut into work items, and the workspace their results need.

    Depends only on seq_lens and shapes, so it is made once per batch layout and reused by
    every layer; mla_decode with a plan does no host synchronisation and no allocation (CUDA
    graph safe). The kernel reads seq_lens from the tensor it is given: it must hold the
    lengths the plan was made from.
    """
    work: _torch.Tensor         # int32 [num_work, 4]: (batch, kv_start, kv_end, slot); slot -1
                                # means the sequence's only item, written straight to the output
    batch_slots: _torch.Tensor  # int32 [batch + 1]: sequence b's partial results are slots
                                # batch_slots[b] ..< batch_slots[b + 1] (none for one item)
    partial_out: _torch.Tensor  # float32 [max(num_slots, 1), q_len * num_heads, head_dim_v]
    partial_lse: _torch.Tensor  # float32 [max(num_slots, 1), q_len * num_heads]
    batch: int
    num_heads: int
    q_len: int
    page_size: int
    kv_dtype: _torch.dtype
    chunk_size: int             # keys per work item (the last of a sequence may have fewer)
    num_work: int
    num_slots: int
    max_seq_len: int
    config: _Any = None         # the kernel config the chunks were sized for


def mla_chunk_size(seq_lens: list[int], *, programs_per_item: int, num_sms: int,
                   block_n: int, min_chunk: int) -> int:
    """Keys per work item: enough items for one wave over every SM, none shorter than min_chunk.

    Equal chunks keep mixed lengths balanced: a long sequence becomes many items of the same
    size as everyone else's, and the hardware scheduler hands them to idle SMs. Chunks are
    whole KV tiles so only a sequence's last tile needs bounds masks.
    """
    total = sum(seq_lens)
    per_sm = -(-total * programs_per_item // num_sms)
    chunk = max(min_chunk, per_sm, 1)
    return -(-chunk // block_n) * block_n


def split_mla_work(seq_lens: list[int], chunk_size: int) -> tuple[list[tuple[int, int, int, int]], list[int]]:
    """(work items (batch, kv_start, kv_end, slot), batch_slots) for sequences cut every chunk_size keys.

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
            work.append((b, start, min(start + chunk_size, seq_lens[b]), slot))
    return work, batch_slots


def make_mla_plan(seq_lens: list[int], *, num_heads: int, q_len: int, page_size: int,
                  kv_dtype: _torch.dtype, head_dim_v: int, programs_per_item: int,
                  num_sms: int, block_n: int, min_chunk: int, device, config=None) -> MLAPlan:
    chunk = mla_chunk_size(seq_lens, programs_per_item=programs_per_item, num_sms=num_sms,
                           block_n=block_n, min_chunk=min_chunk)
    work, batch_slots = split_mla_work(seq_lens, chunk)
    num_slots = batch_slots[-1]
    num_rows = q_len * num_heads
    return MLAPlan(
        work=_torch.tensor(work, dtype=_torch.int32, device=device).reshape(-1, 4),
        batch_slots=_torch.tensor(batch_slots, dtype=_torch.int32, device=device),
        partial_out=_torch.empty((max(num_slots, 1), num_rows, head_dim_v), dtype=_torch.float32,
                                 device=device),
        partial_lse=_torch.empty((max(num_slots, 1), num_rows), dtype=_torch.float32, device=device),
        batch=len(seq_lens), num_heads=num_heads, q_len=q_len, page_size=page_size,
        kv_dtype=kv_dtype, chunk_size=chunk, num_work=len(work), num_slots=num_slots,
        max_seq_len=max(seq_lens), config=config,
    )
