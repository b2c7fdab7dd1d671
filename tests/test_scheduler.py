"""The persistent prefill tile order (tileattn.scheduler), on the CPU."""

import pytest

from tileattn.scheduler import prefill_tile_order, prefill_tile_order_list


def program_work(order, num_m_blocks, num_programs, causal):
    """Work per program when program p runs items p, p + P, ...; a causal tile costs m + 1."""
    work = [0] * num_programs
    for index, tile in enumerate(order):
        work[index % num_programs] += (tile % num_m_blocks + 1) if causal else 1
    return work


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("num_m_blocks,num_batch_heads,num_programs",
                         [(1, 1, 132), (8, 128, 132), (128, 128, 132), (33, 7, 132), (5, 3, 4),
                          (131, 1, 132)])
def test_every_tile_exactly_once(num_m_blocks, num_batch_heads, num_programs, causal):
    order = prefill_tile_order_list(num_m_blocks, num_batch_heads, causal, num_programs)
    assert sorted(order) == list(range(num_m_blocks * num_batch_heads))


@pytest.mark.parametrize("num_m_blocks,num_batch_heads,num_programs",
                         [(8, 128, 132), (128, 128, 132), (33, 7, 132), (5, 3, 4), (64, 32, 132)])
def test_causal_balance_within_one_tile(num_m_blocks, num_batch_heads, num_programs):
    order = prefill_tile_order_list(num_m_blocks, num_batch_heads, True, num_programs)
    work = program_work(order, num_m_blocks, num_programs, True)
    # Stated bound: busiest - idlest <= the longest tile's cost (num_m_blocks key blocks).
    assert max(work) - min(work) <= num_m_blocks
    # And it is a real improvement over the launch-order grid for the long cases.
    if num_m_blocks * num_batch_heads >= 4 * num_programs:
        naive = [m + num_m_blocks * bh for bh in range(num_batch_heads) for m in range(num_m_blocks)]
        naive_work = program_work(naive, num_m_blocks, num_programs, True)
        assert max(work) <= max(naive_work)


def test_causal_longest_first_and_noncausal_heads_adjacent():
    causal = prefill_tile_order_list(16, 4, True, 132)
    assert [t % 16 for t in causal[:4]] == [15] * 4
    full = prefill_tile_order_list(16, 4, False, 132)
    assert [t // 16 for t in full[:16]] == [0] * 16  # one head's tiles together: K/V reuse in L2


def test_tensor_is_int32_and_cached():
    a = prefill_tile_order(8, 4, True, 132, "cpu")
    b = prefill_tile_order(8, 4, True, 132, "cpu")
    assert a is b and a.dtype.is_floating_point is False and a.tolist() == \
        prefill_tile_order_list(8, 4, True, 132)
