"""The varlen work lists' two device passes (scheduler/prefill.py, varlen_work_lists): two
launches and a sort where torch's elementwise ops took about forty host calls a list, most of a
packed call's host time (docs/design.md, "Serving masks and varlen/paged prefill").

pair_keys_kernel: per (sequence, query block) pair i = sequence·M + m (M = num_m_blocks): its
    cost (key blocks + 1, causal bottom-right per sequence; 0 past the sequence's end) and
    its sort key: band (cost // BAND) descending, sequence, cost descending; counts the pairs
    of positive cost.
place_tiles_kernel: per list position (the sorted pairs, each expanded over its heads): the
    tile id m + M·(sequence·H + head), written where the snake puts it (program p takes
    positions p, 2P-1-p, 2P+p, ...; its lap-th one goes to starts[p] + lap); program 0 also
    writes every program's end (its positions that hold a real tile, in closed form).
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
def pair_keys_kernel(cu_seqlens_q_ptr, cu_seqlens_k_ptr, key_ptr, real_pairs_ptr, num_pairs,
                     num_m_blocks, batch, block_m, block_n, CAUSAL: tl.constexpr,
                     BAND: tl.constexpr, COST_LIMIT: tl.constexpr, BLOCK: tl.constexpr):
    pair = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = pair < num_pairs
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
    key = (sequence.to(tl.int64) - band * batch) * COST_LIMIT + (COST_LIMIT - cost)
    tl.store(key_ptr + pair, key, mask=valid)
    tl.atomic_add(real_pairs_ptr, tl.sum((valid & (cost > 0)).to(tl.int32), axis=0))


@triton.jit
def place_tiles_kernel(order_ptr, starts_ptr, real_pairs_ptr, tile_ids_ptr, ends_ptr,
                       num_positions, num_m_blocks, num_heads, num_programs,
                       BLOCK: tl.constexpr, PROGRAMS_BLOCK: tl.constexpr):
    position = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = position < num_positions
    pair = tl.load(order_ptr + position // num_heads, mask=valid, other=0)
    head = position % num_heads
    tile = pair % num_m_blocks + num_m_blocks * (pair // num_m_blocks * num_heads + head)
    lap = position // num_programs
    lane = position % num_programs
    program = tl.where(lap % 2 == 0, lane, num_programs - 1 - lane)
    start = tl.load(starts_ptr + program, mask=valid, other=0)
    tl.store(tile_ids_ptr + start + lap, tile.to(tl.int32), mask=valid)
    if tl.program_id(0) == 0:
        # Real tiles are the list's first real_pairs·H positions: whole laps, then the first
        # `rest` positions of the next lap (its low lanes when the lap is even, else high).
        real = tl.load(real_pairs_ptr) * num_heads
        laps = real // num_programs
        rest = real % num_programs
        programs = tl.arange(0, PROGRAMS_BLOCK)
        extra = tl.where(laps % 2 == 0, programs < rest, programs >= num_programs - rest)
        starts = tl.load(starts_ptr + programs, mask=programs < num_programs, other=0)
        tl.store(ends_ptr + programs, starts + laps + extra.to(tl.int32),
                 mask=programs < num_programs)


def pair_keys_launch(cu_seqlens_q, cu_seqlens_k, keys, real_pairs, num_m_blocks, block_m,
                     block_n, causal, band) -> KernelLaunch:
    """keys int64 [B·M] and real_pairs int32 [1] (zeroed) of the pairs (module docstring)."""
    batch = cu_seqlens_q.shape[0] - 1
    args = dict(cu_seqlens_q_ptr=cu_seqlens_q, cu_seqlens_k_ptr=cu_seqlens_k, key_ptr=keys,
                real_pairs_ptr=real_pairs, num_pairs=keys.numel(), num_m_blocks=num_m_blocks,
                batch=batch, block_m=block_m, block_n=block_n)
    return KernelLaunch(pair_keys_kernel, (max(1, triton.cdiv(keys.numel(), BLOCK)),), args,
                        dict(CAUSAL=causal, BAND=band, COST_LIMIT=COST_LIMIT, BLOCK=BLOCK),
                        NUM_WARPS, 1)


def place_tiles_launch(order, starts, real_pairs, tile_ids, ends, num_m_blocks,
                       num_heads) -> KernelLaunch:
    """tile_ids int32 [B·H·M] and ends int32 [P] from the sorted pairs (module docstring)."""
    num_programs = ends.numel()
    args = dict(order_ptr=order, starts_ptr=starts, real_pairs_ptr=real_pairs,
                tile_ids_ptr=tile_ids, ends_ptr=ends, num_positions=tile_ids.numel(),
                num_m_blocks=num_m_blocks, num_heads=num_heads, num_programs=num_programs)
    # At least one program: program 0 writes the ends even of an empty list.
    grid = (max(1, triton.cdiv(tile_ids.numel(), BLOCK)),)
    return KernelLaunch(place_tiles_kernel, grid, args,
                        dict(BLOCK=BLOCK, PROGRAMS_BLOCK=triton.next_power_of_2(num_programs)),
                        NUM_WARPS, 1)
