"""The persistent prefill work lists (tileattn.scheduler), on the CPU."""

import pytest
import torch

from tileattn.scheduler import (heads_per_group, prefill_work_lists, prefill_work_lists_python,
                                varlen_work_lists,
                                weighted_work_lists_python)

from tileattn.scheduler.prefill import VARLEN_COST_BAND

from .compile_helpers import run_without_interpreter

SHAPES = [(1, 1, 132), (8, 128, 132), (128, 128, 132), (33, 7, 132), (5, 3, 4), (131, 1, 132),
          (64, 32, 132), (32, 128, 132)]


def program_lists(num_m_blocks, num_batch_heads, causal, num_programs, group_heads=None):
    tile_ids, starts = prefill_work_lists_python(num_m_blocks, num_batch_heads, causal,
                                                 num_programs, group_heads)
    assert starts[0] == 0 and starts[-1] == len(tile_ids) and len(starts) == num_programs + 1
    return [tile_ids[starts[p]:starts[p + 1]] for p in range(num_programs)]


def cost(tile, num_m_blocks, causal):
    return tile % num_m_blocks + 1 if causal else 1


@pytest.mark.parametrize("group_heads", [None, 1, 2, 8])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("num_m_blocks,num_batch_heads,num_programs", SHAPES)
def test_every_tile_exactly_once(num_m_blocks, num_batch_heads, num_programs, causal, group_heads):
    lists = program_lists(num_m_blocks, num_batch_heads, causal, num_programs, group_heads)
    assert sorted(t for tiles in lists for t in tiles) == list(range(num_m_blocks * num_batch_heads))


@pytest.mark.parametrize("group_heads", [None, 1, 2, 8])
@pytest.mark.parametrize("num_m_blocks,num_batch_heads,num_programs", SHAPES)
def test_causal_balance_within_one_tile(num_m_blocks, num_batch_heads, num_programs, group_heads):
    lists = program_lists(num_m_blocks, num_batch_heads, True, num_programs, group_heads)
    work = [sum(cost(t, num_m_blocks, True) for t in tiles) for tiles in lists]
    # Stated bound: busiest - idlest <= the longest tile's cost (num_m_blocks key blocks).
    assert max(work) - min(work) <= num_m_blocks
    # And a real improvement over the launch-order grid (tile i on program i % P) when long.
    if num_m_blocks * num_batch_heads >= 4 * num_programs:
        naive = [0] * num_programs
        for i in range(num_m_blocks * num_batch_heads):
            naive[i % num_programs] += cost(i, num_m_blocks, True)
        assert max(work) <= max(naive)


def test_causal_groups_keep_a_wave_on_few_heads():
    """D=128 N=16k bf16, B=4 H=32: two heads' K/V (8 MB each) fit the 16 MB group, so the tiles
    the 132 programs start first all come from heads 0 and 1 (their K/V is read once, from L2
    for everybody else), and longest first."""
    group_heads = heads_per_group(True, 16384, 256, 2)
    assert group_heads == 2
    lists = program_lists(128, 128, True, 132, group_heads)
    first_wave = [tiles[0] for tiles in lists]
    assert {t // 128 for t in first_wave} == {0, 1}
    assert min(t % 128 for t in first_wave) >= 128 - 66
    # Without groups the first wave touches 128 different heads.
    ungrouped = program_lists(128, 128, True, 132)
    assert len({tiles[0] // 128 for tiles in ungrouped}) == 128


def test_noncausal_is_round_robin_with_heads_adjacent():
    lists = program_lists(16, 4, False, 132)
    assert all(tiles == ([p] if p < 64 else []) for p, tiles in enumerate(lists))
    lists = program_lists(128, 8, False, 132)
    for p, tiles in enumerate(lists):
        assert tiles == list(range(p, 128 * 8, 132))  # a wave = adjacent tiles of one head


def test_tensors_are_int32_and_cached():
    a = prefill_work_lists(8, 4, True, 132, "cpu", 2)
    b = prefill_work_lists(8, 4, True, 132, "cpu", 2)
    assert a is b and all(t.dtype == torch.int32 for t in a)
    assert (a[0].tolist(), a[1].tolist()) == prefill_work_lists_python(8, 4, True, 132, 2)


@pytest.mark.parametrize("group_heads", [1, 3])
def test_weighted_lists_cover_every_tile_and_balance(group_heads):
    """Tiles of arbitrary cost (a block mask's): each once, costliest first within a head
    group, and no program more than one tile's cost above the idlest."""
    generator = torch.Generator().manual_seed(0)
    num_m_blocks, num_batch_heads, num_programs = 9, 7, 5
    costs = torch.randint(1, 40, (num_m_blocks * num_batch_heads,), generator=generator).tolist()
    tile_ids, starts = weighted_work_lists_python(costs, num_m_blocks, num_batch_heads,
                                                  num_programs, group_heads)
    assert sorted(tile_ids) == list(range(len(costs)))
    loads = [sum(costs[t] for t in tile_ids[a:b]) for a, b in zip(starts, starts[1:])]
    assert max(loads) - min(loads) <= max(costs)
    # Equal costs reproduce the causal order's tie-break (later query blocks first).
    uniform, _ = weighted_work_lists_python([1] * 12, 4, 3, 1, 3)
    assert uniform == prefill_work_lists_python(4, 3, True, 1, 3)[0]


@pytest.mark.parametrize("kv_heads", [1, 2, 6])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_lists_hold_every_tile_once_and_balance(causal, kv_heads):
    """Packed sequences: every tile of the longest sequence's grid once, each program's real
    tiles [start, end) before those past their sequence's end, and programs' work within the
    costliest tile of each other."""
    lengths_q = [1000, 0, 1, 3000, 517, 64, 300]
    lengths_k = [1200, 77, 1, 3000, 0, 64, 129]
    cu_q, cu_k = (torch.tensor([0] + l).cumsum(0).to(torch.int32) for l in (lengths_q, lengths_k))
    heads, block_m, block_n, programs = 6, 128, 128, 5
    num_m_blocks = -(-max(lengths_q) // block_m)
    tile_ids, starts, ends = varlen_work_lists(cu_q, cu_k, heads, kv_heads, num_m_blocks,
                                               block_m, block_n, causal, programs)
    assert sorted(tile_ids.tolist()) == list(range(len(lengths_q) * heads * num_m_blocks))
    assert starts.tolist()[-1] == len(tile_ids) and starts.dtype == ends.dtype == torch.int32

    def cost(tile):
        m, sequence = tile % num_m_blocks, tile // num_m_blocks // heads
        if m * block_m >= lengths_q[sequence]:
            return 0
        end = lengths_k[sequence]
        if causal:
            end = max(0, min(end, (m + 1) * block_m + lengths_k[sequence] - lengths_q[sequence]))
        return -(-end // block_n) + 1
    ranges = list(zip(starts.tolist(), ends.tolist(), starts.tolist()[1:]))
    for start, end, next_start in ranges:     # the real tiles, then only empty ones
        assert all(cost(t) > 0 for t in tile_ids[start:end].tolist())
        assert all(cost(t) == 0 for t in tile_ids[end:next_start].tolist())
    loads = [sum(cost(t) for t in tile_ids[a:b].tolist()) for a, b, _ in ranges]
    assert max(loads) - min(loads) <= max(cost(t) for t in range(len(tile_ids)))
    # In list order (the snake undone), real tiles come as one kv head's query heads together,
    # and a sequence's tiles within a cost band by kv head.
    group = heads // kv_heads
    listed = []
    for position in range(sum(b - a for a, b, _ in ranges)):
        lap, lane = divmod(position, programs)
        program = lane if lap % 2 == 0 else programs - 1 - lane
        listed.append(int(tile_ids[starts[program] + lap]))
    for first in range(0, len(listed), group):
        block = listed[first:first + group]
        assert sorted(t // num_m_blocks % heads for t in block) == list(
            range(block[0] // num_m_blocks % heads // group * group,
                  block[0] // num_m_blocks % heads // group * group + group))
        assert len({(t % num_m_blocks, t // num_m_blocks // heads) for t in block}) == 1
    items = [(cost(t) // VARLEN_COST_BAND, t // num_m_blocks // heads,
              t // num_m_blocks % heads // group) for t in listed[::group]]
    for (band, sequence, kv_head), following in zip(items, items[1:]):
        if following[:2] == (band, sequence):
            assert following[2] >= kv_head


WORK_LISTS_CHILD = r'''
import json, torch
from tileattn.kernels import work_lists
from tileattn.kernels.compile import cross_compile
cu = torch.zeros(9, dtype=torch.int32)
keys = torch.empty(8 * 5 * 4, dtype=torch.int64)
real = torch.zeros(1, dtype=torch.int32)
order = torch.empty(8 * 5 * 4, dtype=torch.int64)
starts = torch.zeros(133, dtype=torch.int32)
tile_ids = torch.empty(8 * 5 * 32, dtype=torch.int32)
ends = torch.empty(132, dtype=torch.int32)
launches = [work_lists.item_keys_launch(cu, cu, keys, real, 5, 4, 128, 128, True, 16),
            work_lists.item_keys_launch(cu, cu, keys, real, 5, 4, 128, 64, False, 16),
            work_lists.place_tiles_launch(order, starts, real, tile_ids, ends, 5, 32, 4)]
print(json.dumps([[cap, cross_compile(launch, cap).shared_bytes] for cap in (80, 89, 90)
                  for launch in launches]))
'''


def test_varlen_list_kernels_compile_for_every_chip():
    """The two kernels every packed Hopper call runs before attention compile for sm80, sm89
    and sm90 (the interpreter accepts what the compiler might not)."""
    compiled = run_without_interpreter(WORK_LISTS_CHILD)
    assert len(compiled) == 9 and all(shared >= 0 for _, shared in compiled)


@pytest.mark.parametrize("lengths", [[], [0, 0, 0]])
def test_varlen_lists_without_queries_end_where_they_start(lengths):
    """No sequence or only empty ones: every program's list ends where it starts."""
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0).to(torch.int32)
    tile_ids, starts, ends = varlen_work_lists(cu, cu, 4, 2, 1, 128, 128, True, 3)
    assert len(tile_ids) == len(lengths) * 4 and torch.equal(ends, starts[:-1])
