"""tileattn.distributed on the CPU: the ring's plan, merge and block backward in-process, and
whole groups of 2 and 4 spawned ranks (gloo, Triton interpreter) against single-process
tileattn.attention(), the fp64 reference and fp64 autograd (tests/distributed_cases.py)."""

import datetime
import math

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
import torch.distributed as dist

import tileattn
import tileattn.distributed as td
from tileattn.distributed import checks
from tileattn.distributed.block_backward import _reference_block_backward
from tileattn.distributed.layout import block_task, chunks_per_rank, local_runs
from tileattn.distributed.ring import merge_into
from tileattn.reference import attention_reference

from . import distributed_cases
from .distributed_harness import run_group

# Seconds a whole spawned group may take before it is killed and its cases fail (on an idle
# 2-core machine about 15 s for 2 ranks and 25 s for 4). Collectives time out after 120 s.
GROUP_DEADLINE_S = 300


# ---- the plan: which (query, key) pairs each ring step computes --------------------------------

def _positions(layout, rank, world_size, seqlen):
    return torch.cat([torch.arange(start, start + length)
                      for start, length in local_runs(layout, rank, world_size, seqlen)])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_ring_steps_cover_the_mask_exactly_once(world_size, layout, causal):
    """Over all ranks and steps, every visible (query, key) pair of the full sequence is
    computed once and no hidden pair ever; under zigzag causal every rank does equal work."""
    for chunk in (1, 3):
        seqlen = chunk * world_size * chunks_per_rank(layout)
        local_len = seqlen // world_size
        counts = torch.zeros(seqlen, seqlen, dtype=torch.int64)
        work = []
        for rank in range(world_size):
            rows = _positions(layout, rank, world_size, seqlen)
            pairs = 0
            for step in range(world_size):
                source = (rank - step) % world_size
                task = block_task(layout, causal, rank, source, local_len)
                if task is None:
                    continue
                q_pos = rows[task.q_rows]
                k_pos = _positions(layout, source, world_size, seqlen)[task.k_rows]
                seen = torch.ones(len(q_pos), len(k_pos), dtype=torch.int64)
                if task.causal:  # bottom-right aligned, as tileattn.attention masks
                    seen = torch.tril(seen, diagonal=len(k_pos) - len(q_pos))
                counts[q_pos[:, None], k_pos[None, :]] += seen
                pairs += int(seen.sum())
            work.append(pairs)
        full = torch.ones(seqlen, seqlen, dtype=torch.int64)
        assert torch.equal(counts, torch.tril(full) if causal else full)
        if layout == "zigzag" or not causal:
            assert len(set(work)) == 1, work


# ---- the merge ---------------------------------------------------------------------------------

def test_merge_of_key_blocks_equals_attention_over_all_keys():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 9, 3, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    ref_out, ref_lse = attention_reference(q, k, v)
    out, lse = attention_reference(q, k[:, :4], v[:, :4])
    merge_into(out, lse, *attention_reference(q, k[:, 4:], v[:, 4:]))
    assert torch.allclose(out, ref_out, atol=1e-12) and torch.allclose(lse, ref_lse, atol=1e-12)


def test_merge_keeps_rows_that_saw_nothing():
    """Rows no key reached (lse -inf, output 0) stay so when merged with another such block,
    and take the other block's result exactly when it has one: never NaN."""
    out = torch.zeros(1, 4, 2, 8)
    lse = torch.full((1, 2, 4), -math.inf)
    block_out = torch.randn(1, 4, 2, 8)
    block_lse = torch.randn(1, 2, 4)
    block_out[:, :2], block_lse[..., :2] = 0.0, -math.inf  # rows 0, 1 see nothing in either
    merge_into(out, lse, block_out, block_lse)
    assert torch.equal(out, block_out) and torch.equal(lse, block_lse)
    assert not out.isnan().any() and torch.isneginf(lse[..., :2]).all()


def test_merge_kernel_on_strided_rows_equals_the_formula():
    """The merge kernel on the ring's views (a slice of the rows of out and lse, Dv not a power
    of two, -inf on either side or both) against torch's logaddexp formula."""
    gen = torch.Generator().manual_seed(3)
    out_full = torch.randn(2, 150, 3, 24, generator=gen)
    lse_full = torch.randn(2, 3, 150, generator=gen) * 4
    block_out = torch.randn(2, 75, 3, 24, generator=gen)
    block_lse = torch.randn(2, 3, 75, generator=gen) * 4
    rows = slice(75, 150)
    lse_full[0, 1, 80:90] = -math.inf
    out_full[0, 80:90, 1] = 0.0
    block_lse[0, 1, 5:12], block_out[0, 5:12, 1] = -math.inf, 0.0  # rows 80..86: both empty
    block_lse[1, 2, 30:40], block_out[1, 30:40, 2] = -math.inf, 0.0
    merged = torch.logaddexp(lse_full[:, :, rows], block_lse)
    reference = torch.where(torch.isneginf(merged), 0.0, merged)
    def weight(x):
        return torch.exp(x - reference).transpose(1, 2)[..., None]
    expected = out_full[:, rows] * weight(lse_full[:, :, rows]) + block_out * weight(block_lse)
    untouched = out_full[:, :75].clone(), lse_full[:, :, :75].clone()
    merge_into(out_full[:, rows], lse_full[:, :, rows], block_out, block_lse)
    torch.testing.assert_close(out_full[:, rows], expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse_full[:, :, rows], merged, rtol=1e-6, atol=1e-6)
    assert torch.equal(out_full[:, :75], untouched[0])
    assert torch.equal(lse_full[:, :, :75], untouched[1])
    assert torch.isneginf(lse_full[0, 1, 80:87]).all() and not out_full.isnan().any()


# ---- the block backward stand-in -----------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
def test_block_backward_terms_sum_to_the_full_gradient(causal):
    """The stand-in's terms over key blocks, each given the merged out/lse, add up to fp64
    autograd of attention over all keys (GQA, Dv != D, Sq != Sk, bottom-right causal): the
    composition the ring's backward relies on."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 7, 4, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 11, 2, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 11, 2, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    dout = torch.randn(2, 7, 4, 8, generator=gen, dtype=torch.float64)
    out, lse = attention_reference(q, k, v, causal=causal, softmax_scale=0.4)
    (out * dout).sum().backward()
    out, lse = out.detach(), lse.detach()
    # Query i sees keys j <= i + 4: all of keys 0..4 (unmasked), and of keys 5..10 a
    # bottom-right causal block in which query 0 sees nothing.
    blocks = [(slice(0, 5), False), (slice(5, 11), causal)]
    dq = torch.zeros_like(q)
    dk, dv = [], []
    for keys, block_causal in blocks:
        block_dq, block_dk, block_dv = _reference_block_backward(
            dout, q.detach(), k.detach()[:, keys], v.detach()[:, keys], out, lse,
            causal=block_causal, softmax_scale=0.4)
        dq += block_dq.double()
        dk.append(block_dk.double())
        dv.append(block_dv.double())
    for got, want in ((dq, q.grad), (torch.cat(dk, 1), k.grad), (torch.cat(dv, 1), v.grad)):
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_the_kernel_block_backward_composes_like_the_formulas(causal):
    """block_backward (tileattn's backward kernels) per key block, given the merged out/lse,
    sums to the fp64 gradient within fp16 noise (GQA, Dv != D, Sq != Sk)."""
    from tileattn.distributed.block_backward import block_backward
    from .conftest import GRAD_TOLERANCES
    gen = torch.Generator().manual_seed(2)
    q, k, v, dout = (torch.randn(*shape, generator=gen).half().to(DEVICE)
                     for shape in ((2, 37, 4, 64), (2, 51, 2, 64), (2, 51, 2, 128),
                                   (2, 37, 4, 128)))
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    out, lse = attention_reference(*leaves, causal=causal, softmax_scale=0.125)
    want = torch.autograd.grad(out, leaves, dout.double())
    out, lse = out.detach().half(), lse.detach().float()
    blocks = [(slice(0, 15), False), (slice(15, 51), causal)]   # query i sees keys <= i + 14
    dq = torch.zeros(q.shape, dtype=torch.float64, device=DEVICE)
    dk, dv = [], []
    for keys, block_causal in blocks:
        block_dq, block_dk, block_dv = block_backward(dout, q, k[:, keys], v[:, keys], out, lse,
                                                      causal=block_causal, softmax_scale=0.125)
        dq += block_dq.double()
        dk.append(block_dk.double())
        dv.append(block_dv.double())
    for got, expected in ((dq, want[0]), (torch.cat(dk, 1), want[1]), (torch.cat(dv, 1), want[2])):
        assert float((got - expected).norm() / expected.norm()) < GRAD_TOLERANCES[torch.float16]


# ---- backends -----------------------------------------------------------------------------------

def test_backend_rules():
    assert checks.backend_serving("cpu:gloo,cuda:nccl", "cuda") == "nccl"
    assert checks.backend_serving("nccl", "cpu") is None
    # NCCL has no CPU tensors at all; gloo all-gathers CUDA tensors but cannot send them.
    assert "cannot send cpu tensors" in checks.point_to_point_error("nccl", "cpu")
    assert "no collectives for cpu" in checks.collective_error("nccl", "cpu")
    assert "nccl" in checks.point_to_point_error("gloo", "cuda")
    assert checks.collective_error("gloo", "cuda") is None
    for spec in ("gloo", "cpu:gloo,cuda:nccl"):
        assert checks.point_to_point_error(spec, "cpu") is None
    assert checks.point_to_point_error("cpu:gloo,cuda:nccl", "cuda") is None


def test_refused_without_an_initialized_group():
    if dist.is_initialized():
        pytest.skip("a default group exists in this process")
    q = torch.randn(1, 4, 2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="not initialized"):
        td.attention(q, q, q)
    with pytest.raises(ValueError, match="not initialized"):
        td.shard(q)


# ---- one rank, in this process --------------------------------------------------------------------

@pytest.fixture
def group_of_one(tmp_path):
    if dist.is_initialized():
        pytest.skip("a default group exists in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=30))
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_one_rank_is_attention(group_of_one):
    """With one rank the ring is a single step, so the result is tileattn.attention's (its
    fp32 output rounded once, here instead of in the kernel)."""
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 26, 2, 64, generator=gen, dtype=torch.float16) for _ in range(3))
    out, lse = td.attention(q, k, v, causal=True, return_lse=True)
    want, want_lse = tileattn.attention(q, k, v, causal=True, return_lse=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    assert torch.equal(td.unshard(td.shard(q)), q)
    with pytest.raises(ValueError, match="length must be a multiple of 2"):
        td.attention(q[:, :25], k[:, :25], v[:, :25])
    with pytest.raises(TypeError, match="group must be"):
        td.attention(q, k, v, group="world")


# ---- groups of spawned ranks ----------------------------------------------------------------------

def _group_fixture(world_size, case_names):
    @pytest.fixture(scope="module")
    def results(tmp_path_factory):
        store = tmp_path_factory.mktemp(f"group{world_size}") / "store"
        return run_group(world_size, case_names, str(store), GROUP_DEADLINE_S)
    return results


two_ranks = _group_fixture(2, distributed_cases.TWO_RANKS)
four_ranks = _group_fixture(4, distributed_cases.FOUR_RANKS)


def _assert_every_rank_passed(reports, case):
    failures = [f"rank {rank}: {status}\n{detail}"
                for rank, (status, detail, _) in enumerate(reports[case]) if status != "ok"]
    assert not failures, "\n".join(failures)
    notes = [detail for _, detail, _ in reports[case] if detail]
    if notes:
        print(f"{case}: {'; '.join(notes)}")


@pytest.mark.parametrize("case", distributed_cases.TWO_RANKS)
def test_two_ranks(two_ranks, case):
    _assert_every_rank_passed(two_ranks, case)


@pytest.mark.parametrize("case", distributed_cases.FOUR_RANKS)
def test_four_ranks(four_ranks, case):
    _assert_every_rank_passed(four_ranks, case)
