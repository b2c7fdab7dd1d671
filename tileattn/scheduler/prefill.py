"""Persistent tile order for prefill attention: one program per SM walks its own list of
tiles (plain Python/torch, unit-tested on the CPU)."""

from __future__ import annotations

import functools
import heapq

import torch

from ..kernels import work_lists

# K+V bytes of the (batch, head) pairs whose causal tiles are interleaved longest-first: small
# enough that they stay in L2 (50 MB on H100, 40 MB on A100) while their programs run. Without
# the groups, a wave's causal tiles come from as many heads as there are programs and every tile
# streams its K/V from HBM, which bounded the Hopper kernel's causal rate (docs/design.md,
# "Persistent scheduling").
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
    return _least_loaded_first(order, lambda tile: tile % num_m_blocks + 1 if causal else 1,
                               num_programs)


def weighted_work_lists_python(costs: list[int], num_m_blocks: int, num_batch_heads: int,
                               num_programs: int, group_heads: int
                               ) -> tuple[list[int], list[int]]:
    """prefill_work_lists_python for tiles of any cost (costs[tile id], e.g. the key blocks a
    block mask lists for the tile): within groups of group_heads (batch, head) pairs the
    costliest tiles first (ties: later query blocks first, heads interleaved, the causal
    order), each to the program with the least work so far."""
    order = prefill_tile_order_list(num_m_blocks, num_batch_heads, True, group_heads)
    tiles_per_group = group_heads * num_m_blocks
    order = sorted(order, key=lambda tile: (tile // tiles_per_group, -costs[tile]))
    return _least_loaded_first(order, costs.__getitem__, num_programs)


def _least_loaded_first(order: list[int], cost, num_programs: int
                        ) -> tuple[list[int], list[int]]:
    """(tile_ids, starts): the tiles in `order`, each to the program with the least work."""
    work = [(0, p) for p in range(num_programs)]   # a heap of (work so far, program)
    lists: list[list[int]] = [[] for _ in range(num_programs)]
    for tile in order:
        done, program = heapq.heappop(work)
        lists[program].append(tile)
        heapq.heappush(work, (done + cost(tile), program))
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


# Key blocks a band of varlen_work_lists' order spans (H100 serving mix: 1, 4, 16, 32, 64 blocks
# -> 16 fastest; docs/design.md, "Serving masks and varlen/paged prefill").
VARLEN_COST_BAND = 16


def varlen_work_lists(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, num_heads: int,
                      num_kv_heads: int, num_m_blocks: int, block_m: int, block_n: int,
                      causal: bool,
                      num_programs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tile_ids, starts, ends) of the Hopper kernel's packed sequences, built on cu_seqlens' device
    without reading them (no synchronisation; CUDA-graph capturable): every tile id m_block +
    num_m_blocks·(sequence·num_heads + head) of the longest sequence's grid, each tile costed
    by its key blocks (causal: bottom-right per sequence), tiles past their sequence's end
    last at cost 0. The costliest first in bands of VARLEN_COST_BAND key blocks, within a band
    one sequence's tiles together, by kv head (costliest first), so that the programs running
    at once share one kv head's K/V in L2; the query heads of a kv head stay together.
    Programs take the list in a snake (0..P-1, P-1..0, ...), which balances a descending list
    without a host-side LPT. Program p runs tile_ids[starts[p]:ends[p]]: its tiles that hold
    queries.

    Two kernels and one sort of the (sequence, query block, kv head) items
    (kernels/work_lists.py)."""
    device = cu_seqlens_q.device
    batch = cu_seqlens_q.shape[0] - 1
    keys = torch.empty(batch * num_m_blocks * num_kv_heads, dtype=torch.int64, device=device)
    real_items = torch.zeros(1, dtype=torch.int32, device=device)
    work_lists.item_keys_launch(cu_seqlens_q, cu_seqlens_k, keys, real_items, num_m_blocks,
                                num_kv_heads, block_m, block_n, causal, VARLEN_COST_BAND).run()
    order = torch.argsort(keys, stable=True)
    starts = _snake_starts(batch * num_heads * num_m_blocks, num_programs, str(device))
    tile_ids = torch.empty(batch * num_heads * num_m_blocks, dtype=torch.int32, device=device)
    ends = torch.empty(num_programs, dtype=torch.int32, device=device)
    work_lists.place_tiles_launch(order, starts, real_items, tile_ids, ends, num_m_blocks,
                                  num_heads, num_kv_heads).run()
    return tile_ids, starts, ends


@functools.lru_cache(maxsize=256)
def _snake_starts(num_tiles: int, num_programs: int, device: str) -> torch.Tensor:
    """starts of a snake over num_tiles, from the count alone (bincount would read the
    device); made once per shape, like prefill_work_lists' tensors."""
    laps, rest = divmod(num_tiles, num_programs)
    last_lap = range(rest) if laps % 2 == 0 else range(num_programs - rest, num_programs)
    starts = [0]
    for program in range(num_programs):
        starts.append(starts[-1] + laps + (program in last_lap))
    return torch.tensor(starts, dtype=torch.int32, device=device)
