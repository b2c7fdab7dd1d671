"""Work plans, in plain Python/torch so they can be unit-tested on the CPU.

Two families live here:
  * persistent tile order for prefill attention (one program per SM walks a list of tiles);
  * split-KV plans for MLA decode (how each sequence's keys are cut across SMs).
"""

from __future__ import annotations

import functools
import heapq

import torch

# ---- persistent prefill tile order --------------------------------------------------------

# K+V bytes of the (batch, head) pairs whose causal tiles are interleaved longest-first: small
# enough that they stay in L2 (50 MB on H100, 40 MB on A100) while their programs run. Without
# the groups, a wave's causal tiles come from as many heads as there are programs and every tile
# streams its K/V from HBM: the Hopper kernel measured 388 TFLOP/s at D=128 N=16k causal, which
# is exactly the time to read 69 GB (each tile's keys once) at 3 TB/s.
LPT_GROUP_BYTES = 16 << 20
LPT_MAX_HEADS = 8


def heads_per_group(causal: bool, seqlen_k: int, head_dims_qk_v: int, element_size: int) -> int:
    """(batch, head) pairs per longest-first group; 1 keeps one head's tiles together
    (non-causal: all tiles cost the same)."""
    if not causal:
        return 1
    kv_bytes = seqlen_k * head_dims_qk_v * element_size
    return max(1, min(LPT_MAX_HEADS, LPT_GROUP_BYTES // max(kv_bytes, 1)))


def prefill_tile_order_list(num_m_blocks: int, num_batch_heads: int, causal: bool,
                            group_heads: int | None = None) -> list[int]:
    """Tile ids (m_block + num_m_blocks * bh) in the order a persistent kernel should start them.

    Non-causal: every tile costs the same and one (batch, head)'s tiles are adjacent, so the
    programs running at one time share its K/V in L2. Causal: a tile's cost grows with m_block;
    the (batch, head) pairs are cut into groups of group_heads (None: one group) whose K/V fits
    in L2 together, and within a group tiles go longest first (LPT), heads interleaved.
    """
    if not causal:
        return list(range(num_m_blocks * num_batch_heads))
    group_heads = group_heads or num_batch_heads
    return [m + num_m_blocks * bh
            for first in range(0, num_batch_heads, group_heads)
            for m in reversed(range(num_m_blocks))
            for bh in range(first, min(first + group_heads, num_batch_heads))]


def prefill_work_lists_python(num_m_blocks: int, num_batch_heads: int, causal: bool,
                              num_programs: int, group_heads: int | None = None
                              ) -> tuple[list[int], list[int]]:
    """(tile_ids, starts): program p runs tile_ids[starts[p]:starts[p + 1]], in that order.

    List scheduling: the tiles, in prefill_tile_order_list's order, each go to the program with
    the least work so far (a causal tile costs m_block + 1 key blocks, others 1). This is what a
    dynamic scheduler would do, decided on the host: a tile's start time follows its place in
    the order, so the L2 grouping holds, and (tests/test_scheduler.py) the busiest and the idlest
    program differ by at most one tile's cost. Non-causal it is round robin: program p's j-th
    tile is j * num_programs + p.
    """
    order = prefill_tile_order_list(num_m_blocks, num_batch_heads, causal, group_heads)
    work = [(0, p) for p in range(num_programs)]   # a heap of (work so far, program)
    lists: list[list[int]] = [[] for _ in range(num_programs)]
    for tile in order:
        done, program = heapq.heappop(work)
        lists[program].append(tile)
        heapq.heappush(work, (done + (tile % num_m_blocks + 1 if causal else 1), program))
    starts = [0]
    for tiles in lists:
        starts.append(starts[-1] + len(tiles))
    return [tile for tiles in lists for tile in tiles], starts


@functools.lru_cache(maxsize=256)
def _prefill_work_lists_cached(num_m_blocks: int, num_batch_heads: int, causal: bool,
                               num_programs: int, group_heads: int | None, device: str):
    tile_ids, starts = prefill_work_lists_python(num_m_blocks, num_batch_heads, causal,
                                                 num_programs, group_heads)
    return (torch.tensor(tile_ids, dtype=torch.int32, device=device),
            torch.tensor(starts, dtype=torch.int32, device=device))


def prefill_work_lists(num_m_blocks: int, num_batch_heads: int, causal: bool, num_programs: int,
                       device, group_heads: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """prefill_work_lists_python as int32 tensors on `device`, built once per shape."""
    return _prefill_work_lists_cached(num_m_blocks, num_batch_heads, causal, num_programs,
                                      group_heads, str(device))


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
    total_keys: int = 0         # sum of seq_lens
    max_slots_per_seq: int = 0  # the most slots one sequence owns (0: every sequence has one item)
    config: _Any = None         # the kernel config the chunks were sized for


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
                  num_sms: int, block_n: int, min_chunk: int, device, config=None,
                  max_items_per_seq: int | None = None, capped_chunk_limit: int = 0) -> MLAPlan:
    chunk = mla_chunk_size(seq_lens, programs_per_item=programs_per_item, num_sms=num_sms,
                           block_n=block_n, min_chunk=min_chunk,
                           max_items_per_seq=max_items_per_seq,
                           capped_chunk_limit=capped_chunk_limit)
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
        max_seq_len=max(seq_lens), total_keys=sum(seq_lens), config=config,
        max_slots_per_seq=max(b - a for a, b in zip(batch_slots, batch_slots[1:])),
    )
