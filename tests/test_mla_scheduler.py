"""Split-KV plans for MLA decode: every key covered exactly once, chunks balanced, deterministic."""

import pytest
import torch

from tileattn import scheduler

CASES = [
    [1],
    [1, 37, 100],
    [8192],
    [8192] + [100] * 31,            # one long sequence among short ones
    [1024] * 768,                   # big batch: no split needed
    [5, 4097, 64, 1, 3000, 17],
]


def plan_for(seq_lens, num_sms=132, programs_per_item=1, block_n=32, min_chunk=128):
    return scheduler.make_mla_plan(seq_lens, num_heads=16, q_len=1, page_size=64,
                                   kv_dtype=torch.bfloat16, head_dim_v=512,
                                   programs_per_item=programs_per_item, num_sms=num_sms,
                                   block_n=block_n, min_chunk=min_chunk, device="cpu")


@pytest.mark.parametrize("seq_lens", CASES, ids=lambda s: f"{len(s)}seqs-max{max(s)}")
@pytest.mark.parametrize("programs_per_item", [1, 4])
def test_every_key_covered_exactly_once(seq_lens, programs_per_item):
    plan = plan_for(seq_lens, programs_per_item=programs_per_item)
    covered = [torch.zeros(length, dtype=torch.int32) for length in seq_lens]
    for batch, start, end, _, _ in plan.work.tolist():
        assert 0 <= start < end <= seq_lens[batch]
        covered[batch][start:end] += 1
    for counts in covered:
        assert bool((counts == 1).all())
    assert plan.num_work == plan.work.shape[0]


@pytest.mark.parametrize("seq_lens", CASES, ids=lambda s: f"{len(s)}seqs-max{max(s)}")
def test_slots_are_unique_and_match_batch_slots(seq_lens):
    plan = plan_for(seq_lens)
    batch_slots = plan.batch_slots.tolist()
    slots = {}
    for batch, start, _, slot, _ in plan.work.tolist():
        items = -(-seq_lens[batch] // plan.chunk_size)
        if items == 1:
            assert slot == -1 and batch_slots[batch] == batch_slots[batch + 1]
        else:
            assert batch_slots[batch] <= slot < batch_slots[batch + 1]
            assert slot - batch_slots[batch] == start // plan.chunk_size
            slots[slot] = batch
    assert sorted(slots) == list(range(plan.num_slots))
    assert plan.partial_out.shape == (max(plan.num_slots, 1), 16, 512)
    assert plan.partial_lse.shape == (max(plan.num_slots, 1), 16)


@pytest.mark.parametrize("seq_lens", CASES, ids=lambda s: f"{len(s)}seqs-max{max(s)}")
@pytest.mark.parametrize("programs_per_item", [1, 2, 8])
def test_balance_bound(seq_lens, programs_per_item):
    """No item is longer than the chunk, the chunk is no longer than one SM's fair share
    (rounded up to a tile, floored at min_chunk), so the plan needs at most one wave plus one
    ragged item per sequence."""
    num_sms, block_n, min_chunk = 132, 32, 128
    plan = plan_for(seq_lens, num_sms=num_sms, programs_per_item=programs_per_item,
                    block_n=block_n, min_chunk=min_chunk)
    fair = -(-sum(seq_lens) * programs_per_item // num_sms)
    assert plan.chunk_size % block_n == 0
    assert plan.chunk_size <= max(min_chunk, fair) + block_n - 1
    sizes = [end - start for _, start, end, _, _ in plan.work.tolist()]
    assert max(sizes) <= plan.chunk_size
    if plan.chunk_size > min_chunk + block_n:   # the fair share set the chunk
        assert plan.num_work * programs_per_item <= num_sms + len(seq_lens) * programs_per_item


def test_long_sequence_is_split_and_short_ones_are_not():
    plan = plan_for([8192] + [100] * 31)
    work = plan.work.tolist()
    assert sum(1 for item in work if item[0] == 0) > 8
    assert all(item[3] == -1 for item in work if item[0] != 0)
    assert work[0][0] == 0, "longest sequence first"


def test_deterministic():
    a, b = plan_for(CASES[5]), plan_for(CASES[5])
    assert torch.equal(a.work, b.work) and torch.equal(a.batch_slots, b.batch_slots)
    assert a.chunk_size == b.chunk_size


def test_config_table_rules_out_a_one_warpgroup_64_row_block():
    """4 warps holding a 64x512 fp32 accumulator faulted on the H100 (docs/design.md, "MLA decode")."""
    import pytest

    from tileattn.kernels.mla.decode import MLAConfig
    with pytest.raises(ValueError, match="accumulator"):
        MLAConfig("split_dv", 64, 64, 1, 4, 2, 128)
    MLAConfig("split_dv", 32, 64, 1, 4, 2, 128)  # <= 32 rows on 4 warps is the sm90 small row
    MLAConfig("dup_qk", 64, 32, 2, 4, 2, 128)    # half the V columns: half the accumulator


def test_splits_per_sequence_are_capped():
    """max_items_per_seq lengthens the chunk so no sequence owns more slots than that (the
    combine's one-pass limit), up to capped_chunk_limit keys."""
    lengths = [32768]
    free = scheduler.make_mla_plan(lengths, num_heads=64, q_len=1, page_size=64,
                                   kv_dtype=torch.bfloat16, head_dim_v=512, programs_per_item=1,
                                   num_sms=132, block_n=64, min_chunk=128, device="cpu")
    capped = scheduler.make_mla_plan(lengths, num_heads=64, q_len=1, page_size=64,
                                     kv_dtype=torch.bfloat16, head_dim_v=512, programs_per_item=1,
                                     num_sms=132, block_n=64, min_chunk=128, device="cpu",
                                     max_items_per_seq=64, capped_chunk_limit=512)
    assert free.max_slots_per_seq == 128 and capped.max_slots_per_seq == 64
    assert capped.chunk_size == 512 and capped.chunk_size % 64 == 0
    # Short sequences keep the fair-share chunk.
    short = scheduler.make_mla_plan([8192], num_heads=64, q_len=1, page_size=64,
                                    kv_dtype=torch.bfloat16, head_dim_v=512, programs_per_item=1,
                                    num_sms=132, block_n=64, min_chunk=128, device="cpu",
                                    max_items_per_seq=64, capped_chunk_limit=512)
    assert short.chunk_size == 128 and short.max_slots_per_seq == 64
    # A very long sequence keeps more items rather than chunks past the limit.
    long = scheduler.make_mla_plan([131072], num_heads=16, q_len=1, page_size=64,
                                   kv_dtype=torch.bfloat16, head_dim_v=512, programs_per_item=1,
                                   num_sms=264, block_n=64, min_chunk=128, device="cpu",
                                   max_items_per_seq=64, capped_chunk_limit=512)
    assert long.chunk_size == 512 and long.num_work == 256
