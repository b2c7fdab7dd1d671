"""The attention backward kernels against fp64 autograd (tileattn/reference.py); on CPU the
real Triton kernels run in the interpreter. dq/dk/dv are poisoned (NaN) before every call."""

import pytest
import torch
import triton
import triton.language as tl

from tileattn.kernels.attention.bwd_scores import visible_block_range

from .backward_helpers import (BackwardCase, check_gradients, eager_gradients, make_problem,
                               make_varlen_problem, poisoned_like, relative_error, run_backward)
from .conftest import GRAD_TOLERANCES

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float16, torch.bfloat16]

CASES = [
    BackwardCase(1, 37, 53, 2, 2),                                     # odd lengths
    BackwardCase(1, 37, 53, 4, 2, causal=True),                        # GQA 4/2, Sq < Sk causal
    BackwardCase(1, 70, 23, 4, 1, causal=True),                        # MQA, Sq > Sk: rows see no key
    BackwardCase(2, 29, 29, 2, 2, 96, 96, causal=True),
    BackwardCase(1, 25, 31, 2, 1, 128, 128),
    BackwardCase(1, 21, 33, 2, 2, 192, 128, causal=True),              # Dv != D
    BackwardCase(1, 45, 45, 2, 2, window_left=8, window_right=4),      # window alone
    BackwardCase(1, 40, 50, 4, 2, causal=True, window_left=11),        # window and causal
    BackwardCase(1, 37, 37, 2, 1, causal=True, softcap=0.5),           # saturating tanh
    BackwardCase(2, 30, 41, 4, 2, alibi=True),
    BackwardCase(1, 33, 40, 2, 2, window_left=10, window_right=2, softcap=3.0, alibi=True),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_fp64_autograd(case, dtype):
    problem = make_problem(case, dtype, DEVICE)
    check_gradients(problem, run_backward(problem), GRAD_TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", [CASES[1], CASES[-1]], ids=str)
def test_no_further_from_fp64_than_an_eager_backward_of_the_same_dtype(case, dtype):
    """The yardstick behind GRAD_TOLERANCES: a plain PyTorch backward in the same dtype."""
    problem = make_problem(case, dtype, DEVICE)
    for grad, eager, expected in zip(run_backward(problem), eager_gradients(problem),
                                     problem.expected):
        assert relative_error(grad, expected) <= 1.5 * relative_error(eager, expected)


def test_rows_that_see_no_key_get_zero_gradient():
    """Sq > Sk causal: query i sees keys j <= i - 16, so the first 16 rows see nothing (and
    row 16, which sees one key, has dq = 0 in exact arithmetic)."""
    problem = make_problem(BackwardCase(1, 40, 24, 2, 1, causal=True), torch.float16, DEVICE)
    assert torch.isinf(problem.lse[:, :, :16]).all() and torch.isfinite(problem.lse[:, :, 16:]).all()
    for deterministic in (False, True):
        dq, dk, dv = run_backward(problem, deterministic=deterministic)
        assert torch.all(dq[:, :16] == 0) and torch.all(dq[:, 17:].abs().sum(-1) > 0)
        check_gradients(problem, (dq, dk, dv), GRAD_TOLERANCES[torch.float16])


def _inside_nan_rows(x: torch.Tensor, pad: int = 48) -> torch.Tensor:
    """x [B, S, H, D] as a view into a NaN-filled [B, pad + S + pad, H, D] buffer: a kernel
    that reads rows outside its tensor pulls NaN into its results."""
    buffer = torch.full((x.shape[0], x.shape[1] + 2 * pad, *x.shape[2:]), float("nan"),
                        dtype=x.dtype, device=x.device)
    buffer[:, pad:pad + x.shape[1]] = x
    return buffer[:, pad:pad + x.shape[1]]


@pytest.mark.parametrize("case", [
    BackwardCase(1, 70, 23, 2, 1, causal=True),                        # rows far past the keys
    BackwardCase(1, 23, 70, 2, 1, window_left=5, window_right=3),      # keys far past the rows
    BackwardCase(1, 64, 64, 2, 2, causal=True, window_left=16),        # whole blocks, no tail
], ids=str)
def test_reads_stay_inside_the_tensors(case):
    problem = make_problem(case, torch.float16, DEVICE)
    q, k, v = (_inside_nan_rows(x) for x in (problem.q, problem.k, problem.v))
    problem.out, problem.dout = _inside_nan_rows(problem.out), _inside_nan_rows(problem.dout)
    for deterministic in (False, True):
        grads = run_backward(problem, q=q, k=k, v=v, deterministic=deterministic)
        check_gradients(problem, grads, GRAD_TOLERANCES[torch.float16])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_varlen_with_empty_and_single_token_sequences(dtype):
    """Packed sequences: one with queries but no keys, one with keys but no queries, single
    tokens, and lengths that differ between q and k (bottom-right causal per sequence)."""
    case = BackwardCase(0, 0, 0, 4, 2, causal=True, window_left=13)
    problem = make_varlen_problem(case, [19, 0, 1, 7, 33], [26, 9, 1, 0, 30], dtype, DEVICE)
    for deterministic in (False, True):
        check_gradients(problem, run_backward(problem, deterministic=deterministic),
                        GRAD_TOLERANCES[dtype])


def test_varlen_with_hooks_and_head_dim_padding():
    case = BackwardCase(0, 0, 0, 2, 1, 96, 64, softcap=2.0, alibi=True)
    problem = make_varlen_problem(case, [5, 18, 1], [21, 3, 17], torch.bfloat16, DEVICE)
    check_gradients(problem, run_backward(problem), GRAD_TOLERANCES[torch.bfloat16])


def test_strided_inputs_and_fused_gradient_buffer():
    """q/k/v slices of one [B, S, 3, H, D] buffer; dq/dk/dv written into slices of one
    poisoned gradient buffer of that shape (each kernel writes through its view's strides)."""
    case = BackwardCase(2, 35, 35, 3, 3, causal=True)
    problem = make_problem(case, torch.float16, DEVICE)
    qkv = torch.stack((problem.q, problem.k, problem.v), dim=2)
    grads = poisoned_like(qkv)
    q, k, v = qkv.unbind(2)
    dq, dk, dv = grads.unbind(2)
    assert not q.is_contiguous() and not dq.is_contiguous()
    for deterministic in (False, True):
        grads.fill_(float("nan"))
        run_backward(problem, dq, dk, dv, q=q, k=k, v=v, deterministic=deterministic)
        check_gradients(problem, (dq, dk, dv), GRAD_TOLERANCES[torch.float16])


def test_deterministic_matches_default_and_repeats_bit_identically():
    problem = make_problem(BackwardCase(2, 45, 38, 4, 2, causal=True, window_left=20),
                           torch.bfloat16, DEVICE)
    default = run_backward(problem)
    first = run_backward(problem, deterministic=True)
    second = run_backward(problem, deterministic=True)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    tolerance = GRAD_TOLERANCES[torch.bfloat16]
    check_gradients(problem, first, tolerance)
    check_gradients(problem, default, tolerance)
    for a, b in zip(first, default):
        assert relative_error(a, b.double()) < tolerance


@triton.jit
def _causal_mask_mod(batch, head, q_idx, kv_idx, q_shift, mod_args):
    return kv_idx <= q_idx + q_shift


def test_mask_hook_masks_every_block():
    """A MASK_MOD hook equal to the causal mask gives the causal gradients; every visited
    block takes the hook's mask (the hook may hide any pair)."""
    from tileattn.arch import arch_of
    from tileattn.kernels.attention.bwd import attention_backward
    problem = make_problem(BackwardCase(1, 39, 47, 2, 1, causal=True), torch.float16, DEVICE)
    for deterministic in (False, True):
        dq, dk, dv = (poisoned_like(x) for x in (problem.q, problem.k, problem.v))
        attention_backward(problem.q, problem.k, problem.v, problem.out, problem.lse,
                           problem.dout, dq, dk, dv, causal=False,
                           softmax_scale=problem.softmax_scale, window_left=-1, window_right=-1,
                           mask_mod=_causal_mask_mod, deterministic=deterministic,
                           arch=arch_of(problem.q.device))
        check_gradients(problem, (dq, dk, dv), GRAD_TOLERANCES[torch.float16])


# ---- which blocks the loops visit ---------------------------------------------------------

@triton.jit
def _block_ranges_kernel(out_ptr, tile_len, other_len, shift, below, above,
                         TILE: tl.constexpr, BLOCK: tl.constexpr,
                         BOUNDED_BELOW: tl.constexpr, BOUNDED_ABOVE: tl.constexpr):
    tile = tl.program_id(0)
    first, full_start, full_end, end = visible_block_range(
        tile * TILE, tile_len, other_len, shift, below, above, TILE, BLOCK, BOUNDED_BELOW,
        BOUNDED_ABOVE)
    tl.store(out_ptr + tile * 4 + 0, first)
    tl.store(out_ptr + tile * 4 + 1, full_start)
    tl.store(out_ptr + tile * 4 + 2, full_end)
    tl.store(out_ptr + tile * 4 + 3, end)


def _blocks(start, stop, block):
    return [(x, min(x + block, stop)) for x in range(start, stop, block)] if stop > start else []


@pytest.mark.skipif(DEVICE != "cpu", reason="a brute-force check of the interpreter's arithmetic")
@pytest.mark.parametrize("tile,block", [(16, 16), (32, 16), (16, 64)])
def test_visited_blocks_are_exactly_the_visible_ones(tile, block):
    """Against brute force over many (lengths, shift, window) settings: every visible pair
    lies in a visited block, every visited block holds a visible pair (work scales with the
    window), and every pair of a block visited unmasked is visible and in bounds."""
    gen = torch.Generator().manual_seed(tile + block)
    for _ in range(60):
        tile_len, other_len = (int(x) for x in torch.randint(1, 90, (2,), generator=gen))
        shift = int(torch.randint(-60, 60, (1,), generator=gen))
        below, above = (int(x) for x in torch.randint(-1, 40, (2,), generator=gen))
        num_tiles = triton.cdiv(tile_len, tile)
        ranges = torch.zeros(num_tiles * 4, dtype=torch.int32)
        _block_ranges_kernel[(num_tiles,)](ranges, tile_len, other_len, shift, below, above,
                                           TILE=tile, BLOCK=block, BOUNDED_BELOW=below >= 0,
                                           BOUNDED_ABOVE=above >= 0)
        for t0, (first, full_start, full_end, end) in zip(range(0, tile_len, tile),
                                                           ranges.view(-1, 4).tolist()):
            rows = range(t0, min(t0 + tile, tile_len))
            sees = lambda t, x: ((below < 0 or x >= t + shift - below)
                                 and (above < 0 or x <= t + shift + above))
            setting = (tile_len, other_len, shift, below, above, t0, first, full_start, full_end, end)
            assert 0 <= first <= full_start <= full_end <= end <= other_len, setting
            visited = (_blocks(first, full_start, block) + _blocks(full_start, full_end, block)
                       + _blocks(full_end, end, block))
            starts = [x0 for x0, _ in visited]
            assert len(set(starts)) == len(starts) and all(x0 % block == 0 for x0 in starts), setting
            for x0, x1 in visited:
                assert any(sees(t, x) for t in rows for x in range(x0, x1)), setting
            visible = {x for t in rows for x in range(other_len) if sees(t, x)}
            assert all(any(x0 <= x < x1 for x0, x1 in visited) for x in visible), setting
            for x0, x1 in _blocks(full_start, full_end, block):
                assert t0 + tile <= tile_len and x1 - x0 == block, setting
                assert all(sees(t, x) for t in rows for x in range(x0, x1)), setting


@pytest.mark.parametrize("causal", [False, True], ids=["no_mask", "causal"])
def test_preprocess_zeroes_dq_rows_only_for_a_launch_that_adds(causal):
    """Where the fused Hopper backward runs key block 0 first, storing its dQ tiles (sm90_bwd_
    fused.first_block_stores: no mask), the preprocess zeroes no dq_accum row; under a causal
    mask (one launch, adding) all of them. It writes delta either way. Built for sm90, run
    here."""
    from tileattn.arch import arch_for_capability
    from tileattn.kernels.attention import bwd
    if DEVICE != "cpu":
        pytest.skip("the preprocess alone, in the interpreter")
    torch.manual_seed(0)
    q = torch.randn(2, 300, 4, 128, dtype=torch.bfloat16)
    k = torch.randn(2, 200, 2, 128, dtype=torch.bfloat16)
    out, dout = torch.randn_like(q), torch.randn_like(q)
    lse = torch.randn(2, 4, 300)
    delta, dq_accum = bwd.backward_workspace(q, lse, False)
    delta.fill_(float("nan"))
    dq_accum.fill_(float("nan"))
    launches = bwd.backward_launches(
        q, k, k, out, lse, dout, torch.empty_like(q), torch.empty_like(k), torch.empty_like(k),
        delta, dq_accum, causal=causal, softmax_scale=0.1, window_left=-1, window_right=-1,
        arch=arch_for_capability((9, 0)), kernel="sm90")
    assert launches[0].kernel is bwd.attention_bwd_preprocess_kernel
    launches[0].run()
    expected = (out.double() * dout.double()).sum(-1).transpose(1, 2)
    assert torch.allclose(delta.double(), expected, rtol=1e-5, atol=1e-4)
    assert (dq_accum == 0).all() if causal else dq_accum.isnan().all()
