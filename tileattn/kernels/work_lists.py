"""The varlen work lists' two device passes (scheduler/prefill.py, varlen_work_lists): two
launches and a sort where torch's elementwise ops took about forty host calls a list, most of a
packed call's host time (docs/design.md, "Serving masks and varlen/paged prefill").

item_keys_kernel: per item i = (sequence·M + m)·KV + kv head (M = num_m_blocks, KV kv heads):
    its cost (key blocks + 1, causal bottom-right per sequence; 0 past the sequence's end) and
    its sort key: band (cost // BAND) descending, sequence, kv head, cost descending; counts
    the items of positive cost.
place_tiles_kernel: per list position (the sorted items, each expanded over the G query heads
    of its kv head): the tile id m + M·(sequence·H + head), written where the snake puts it
    (program p takes positions p, 2P-1-p, 2P+p, ...; its lap-th one goes to starts[p] + lap);
    program 0 also writes every program's end (its positions that hold a real tile, in closed
    form).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .runtime import KernelLaunch

BLOCK = 1024
NUM_WARPS = 4
# Sort keys hold a cost below this (key blocks + 1) in their low bits.
COST_LIMIT = 1 << 24


@triton.jit
def item_keys_kernel(cu_seqlens_q_ptr, cu_seqlens_k_ptr, key_ptr, real_items_ptr, num_items,
                     num_m_blocks, num_kv_heads, batch, block_m, block_n, CAUSAL: tl.constexpr,
                     BAND: tl.constexpr, COST_LIMIT: tl.constexpr, BLOCK: tl.constexpr):
    item = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = item < num_items
    pair = item // num_kv_heads
    kv_head = (item % num_kv_heads).to(tl.int64)
    sequence = pair // num_m_blocks
    m_block = (pair % num_m_blocks).to(tl.int64)
    length_q = (tl.load(cu_seqlens_q_ptr + sequence + 1, mask=valid, other=0)
                - tl.load(cu_seqlens_q_ptr + sequence, mask=valid, other=0)).to(tl.int64)
    length_k = (tl.load(cu_seqlens_k_ptr + sequence + 1, mask=valid, other=0)
                - tl.load(cu_seqlens_k_ptr + sequence, mask=valid, other=0)).to(tl.int64)
    if CAUSAL:
        key_end = tl.maximum(tl.minimum(length_k, (m_block + 1) * block_m + length_k - length_q),
                             0)
    else:
        key_end = length_k
    cost = tl.where(m_block * block_m < length_q, (key_end + block_n - 1) // block_n + 1, 0)
    band = tl.where(cost > 0, cost // BAND, -1)
    key = (((sequence.to(tl.int64) - band * batch) * num_kv_heads + kv_head) * COST_LIMIT
           + (COST_LIMIT - cost))
    tl.store(key_ptr + item, key, mask=valid)
    tl.atomic_add(real_items_ptr, tl.sum((valid & (cost > 0)).to(tl.int32), axis=0))


@triton.jit
def place_tiles_kernel(order_ptr, starts_ptr, real_items_ptr, tile_ids_ptr, ends_ptr,
                       num_positions, num_m_blocks, num_heads, num_kv_heads, num_programs,
                       BLOCK: tl.constexpr, PROGRAMS_BLOCK: tl.constexpr):
    position = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = position < num_positions
    group_size = num_heads // num_kv_heads
    item = tl.load(order_ptr + position // group_size, mask=valid, other=0)
    pair = item // num_kv_heads
    head = (item % num_kv_heads) * group_size + position % group_size
    tile = pair % num_m_blocks + num_m_blocks * (pair // num_m_blocks * num_heads + head)
    lap = position // num_programs
    lane = position % num_programs
    program = tl.where(lap % 2 == 0, lane, num_programs - 1 - lane)
    start = tl.load(starts_ptr + program, mask=valid, other=0)
    tl.store(tile_ids_ptr + start + lap, tile.to(tl.int32), mask=valid)
    if tl.program_id(0) == 0:
        # Real tiles are the list's first real_items·G positions: whole laps, then the first
        # `rest` positions of the next lap (its low lanes when the lap is even, else high).
        real = tl.load(real_items_ptr) * group_size
        laps = real // num_programs
        rest = real % num_programs
        programs = tl.arange(0, PROGRAMS_BLOCK)
        extra = tl.where(laps % 2 == 0, programs < rest, programs >= num_programs - rest)
        starts = tl.load(starts_ptr + programs, mask=programs < num_programs, other=0)
        tl.store(ends_ptr + programs, starts + laps + extra.to(tl.int32),
                 mask=programs < num_programs)


def item_keys_launch(cu_seqlens_q, cu_seqlens_k, keys, real_items, num_m_blocks, num_kv_heads,
                     block_m, block_n, causal, band) -> KernelLaunch:
    """keys int64 [B·M·KV] and real_items int32 [1] (zeroed) of the items (module
    docstring)."""
    batch = cu_seqlens_q.shape[0] - 1
    args = dict(cu_seqlens_q_ptr=cu_seqlens_q, cu_seqlens_k_ptr=cu_seqlens_k, key_ptr=keys,
                real_items_ptr=real_items, num_items=keys.numel(), num_m_blocks=num_m_blocks,
                num_kv_heads=num_kv_heads, batch=batch, block_m=block_m, block_n=block_n)
    return KernelLaunch(item_keys_kernel, (max(1, triton.cdiv(keys.numel(), BLOCK)),), args,
                        dict(CAUSAL=causal, BAND=band, COST_LIMIT=COST_LIMIT, BLOCK=BLOCK),
                        NUM_WARPS, 1)


def place_tiles_launch(order, starts, real_items, tile_ids, ends, num_m_blocks, num_heads,
                       num_kv_heads) -> KernelLaunch:
    """tile_ids int32 [B·H·M] and ends int32 [P] from the sorted items (module docstring)."""
    num_programs = ends.numel()
    args = dict(order_ptr=order, starts_ptr=starts, real_items_ptr=real_items,
                tile_ids_ptr=tile_ids, ends_ptr=ends, num_positions=tile_ids.numel(),
                num_m_blocks=num_m_blocks, num_heads=num_heads, num_kv_heads=num_kv_heads,
                num_programs=num_programs)
    # At least one program: program 0 writes the ends even of an empty list.
    grid = (max(1, triton.cdiv(tile_ids.numel(), BLOCK)),)
    return KernelLaunch(place_tiles_kernel, grid, args,
                        dict(BLOCK=BLOCK, PROGRAMS_BLOCK=triton.next_power_of_2(num_programs)),
                        NUM_WARPS, 1)
