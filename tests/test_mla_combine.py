"""The MLA split-KV combine kernel alone (tileattn/kernels/mla_decode_combine.py): random
partial results merged by their LSEs against an fp64 merge, in one pass (every sequence's
slots fit one step) and in two passes (a sequence with more slots than a step), with rows whose
chunk saw no key (LSE -inf). Sequences with a single work item must be left untouched."""

import pytest
import torch

from tileattn import scheduler
from tileattn.kernels.split_kv_combine import combine_launches

from .test_mla import needs_kernels

NUM_HEADS = 16


def plan_with_slots(lengths):
    """A plan whose chunks are 16 keys, so a sequence of 16·n keys owns n slots."""
    return scheduler.make_mla_plan(lengths, num_heads=NUM_HEADS, q_len=1, page_size=16,
                                   kv_dtype=torch.float16, head_dim_v=512, programs_per_item=1,
                                   num_sms=1 << 20, block_n=16, min_chunk=16, device="cpu")


def merged(plan):
    """fp64 merge of each sequence's slots (None for single-item sequences)."""
    slots = plan.batch_slots.tolist()
    result = []
    for b in range(plan.batch):
        if slots[b + 1] == slots[b]:
            result.append(None)
            continue
        lse = plan.partial_lse[slots[b]:slots[b + 1]].double()
        top = lse.max(0).values
        weight = torch.exp(lse - top)
        out = (plan.partial_out[slots[b]:slots[b + 1]].double() * weight[:, :, None]).sum(0)
        total = weight.sum(0)
        result.append((out / total[:, None], top + torch.log(total)))
    return result


@needs_kernels
@pytest.mark.parametrize("max_slots_per_step", [128, 64, 16, 4])
def test_combine_matches_fp64_merge(max_slots_per_step):
    lengths = [16 * 70, 16 * 3, 7, 16 * 5 + 3]     # 70, 3, 1 (direct) and 6 slots
    plan = plan_with_slots(lengths)
    assert plan.max_slots_per_seq == 70
    gen = torch.Generator().manual_seed(0)
    plan.partial_out.copy_(torch.randn(plan.partial_out.shape, generator=gen))
    plan.partial_lse.copy_(torch.randn(plan.partial_lse.shape, generator=gen) * 4)
    # A chunk whose rows saw no key (a late chunk under the causal rule) weighs nothing.
    first = plan.batch_slots[3].item()
    plan.partial_lse[first + 5, :5] = float("-inf")
    plan.partial_out[first + 5, :5] = 0.0
    q = torch.empty(len(lengths), 1, NUM_HEADS, 576, dtype=torch.float16)
    out = torch.full((len(lengths), 1, NUM_HEADS, 512), float("nan"), dtype=torch.float16)
    lse = torch.full((len(lengths), 1, NUM_HEADS), float("nan"))
    (launch,) = combine_launches(q, out, lse, plan, max_slots_per_step=max_slots_per_step)
    # One pass only where the step covers the 70 slots of sequence 0.
    assert launch.constexprs["ONE_STEP"] == (max_slots_per_step >= 128)
    launch.run()
    for b, want in enumerate(merged(plan)):
        if want is None:   # the partial kernel writes single-item sequences
            assert torch.isnan(out[b]).all() and torch.isnan(lse[b]).all()
            continue
        want_out, want_lse = want
        err = (out[b, 0].double() - want_out).abs().max().item()
        assert err < 2e-3, (b, err)
        assert torch.allclose(lse[b, 0].double(), want_lse, atol=1e-5, rtol=1e-5), b


@needs_kernels
def test_one_pass_where_every_sequence_fits_a_step():
    plan = plan_with_slots([16 * 5, 16 * 3])
    q = torch.empty(2, 1, NUM_HEADS, 576, dtype=torch.float16)
    out = torch.empty(2, 1, NUM_HEADS, 512, dtype=torch.float16)
    lse = torch.empty(2, 1, NUM_HEADS)
    (launch,) = combine_launches(q, out, lse, plan)
    assert launch.constexprs["SLOTS_PER_STEP"] == 8 and launch.constexprs["ONE_STEP"]
