"""The attention backward kernels on a real GPU at real sizes against fp64 autograd: every
head dim, long and lopsided contexts, both dQ modes, the mask/score features, varlen and
fused gradient buffers. The kernels are the ones dispatch picks (on Hopper the Gluon kernels of
sm90_bwd.py where they apply); test_hopper_and_portable_kernels_agree runs both on Hopper.
Skipped on machines without CUDA; run through the device tool."""

import pytest
import torch

from ..backward_helpers import (BackwardCase, check_gradients, make_problem, make_varlen_problem,
                                poisoned_like, relative_error, run_backward)
from ..conftest import GRAD_TOLERANCES

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

HEAD_DIMS = [(64, 64), (96, 96), (128, 128), (192, 128), (256, 256)]
# (batch, seqlen_q, seqlen_k, num_q_heads, num_kv_heads)
SHAPES = [(2, 1000, 1000, 8, 2), (1, 4097, 4097, 4, 4), (1, 17, 3000, 4, 1), (1, 3000, 17, 4, 2)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("head_dims", HEAD_DIMS, ids=lambda d: f"D{d[0]}-{d[1]}")
def test_real_sizes(head_dims, shape, causal):
    case = BackwardCase(*shape, *head_dims, causal=causal)
    problem = make_problem(case, torch.bfloat16, "cuda", seed=sum(shape))
    check_gradients(problem, run_backward(problem), GRAD_TOLERANCES[torch.bfloat16])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fp16(shape, causal):
    case = BackwardCase(*shape, 128, 128, causal=causal)
    problem = make_problem(case, torch.float16, "cuda", seed=sum(shape))
    check_gradients(problem, run_backward(problem), GRAD_TOLERANCES[torch.float16])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dims", HEAD_DIMS, ids=lambda d: f"D{d[0]}-{d[1]}")
def test_deterministic_dq(head_dims, causal):
    case = BackwardCase(2, 1000, 1000, 8, 2, *head_dims, causal=causal)
    problem = make_problem(case, torch.bfloat16, "cuda", seed=5)
    check_gradients(problem, run_backward(problem, deterministic=True),
                    GRAD_TOLERANCES[torch.bfloat16])


FEATURE_CASES = [
    BackwardCase(2, 2048, 2048, 8, 2, 128, 128, window_left=256, window_right=64),
    BackwardCase(2, 1500, 2048, 8, 2, 128, 128, causal=True, window_left=333),
    BackwardCase(2, 1000, 1000, 8, 8, 64, 64, causal=True, softcap=30.0),
    BackwardCase(2, 1000, 1300, 8, 2, 128, 128, alibi=True),
    BackwardCase(1, 2000, 2000, 8, 4, 256, 256, causal=True, window_left=500, softcap=20.0,
                 alibi=True),
]


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic-dq", "deterministic"])
@pytest.mark.parametrize("case", FEATURE_CASES, ids=str)
def test_features(case, deterministic):
    problem = make_problem(case, torch.bfloat16, "cuda", seed=1)
    check_gradients(problem, run_backward(problem, deterministic=deterministic),
                    GRAD_TOLERANCES[torch.bfloat16])


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic-dq", "deterministic"])
@pytest.mark.parametrize("head_dims", [(64, 64), (128, 128), (192, 128)], ids=lambda d: f"D{d[0]}-{d[1]}")
def test_varlen(head_dims, deterministic):
    case = BackwardCase(0, 0, 0, 8, 2, *head_dims, causal=True)
    problem = make_varlen_problem(case, [1000, 0, 1, 3000, 517, 64], [1200, 77, 1, 3000, 0, 64],
                                  torch.bfloat16, "cuda", seed=2)
    check_gradients(problem, run_backward(problem, deterministic=deterministic),
                    GRAD_TOLERANCES[torch.bfloat16])


def test_fused_qkv_and_gradient_buffers():
    case = BackwardCase(2, 1000, 1000, 8, 8, 128, 128, causal=True)
    problem = make_problem(case, torch.bfloat16, "cuda", seed=3)
    qkv = torch.stack((problem.q, problem.k, problem.v), dim=2)
    grads = poisoned_like(qkv)
    (q, k, v), (dq, dk, dv) = qkv.unbind(2), grads.unbind(2)
    run_backward(problem, dq, dk, dv, q=q, k=k, v=v)
    check_gradients(problem, (dq, dk, dv), GRAD_TOLERANCES[torch.bfloat16])


def test_deterministic_repeats_bit_identically_and_matches_default():
    case = BackwardCase(2, 4097, 4097, 8, 2, 128, 128, causal=True)
    problem = make_problem(case, torch.bfloat16, "cuda", seed=4)
    first = run_backward(problem, deterministic=True)
    second = run_backward(problem, deterministic=True)
    default = run_backward(problem)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    tolerance = GRAD_TOLERANCES[torch.bfloat16]
    check_gradients(problem, default, tolerance)
    for a, b in zip(first, default):
        assert relative_error(a, b.double()) < tolerance


HOPPER_CASES = [
    BackwardCase(2, 1000, 1000, 8, 2, 128, 128, causal=True),
    BackwardCase(1, 3000, 17, 4, 2, 128, 128, causal=True),     # rows that see no key
    BackwardCase(1, 17, 3000, 4, 1, 96, 96, causal=True),
    BackwardCase(2, 999, 1031, 8, 4, 128, 64),                  # Dv != D, odd lengths
    BackwardCase(1, 1000, 1300, 4, 2, 192, 128, causal=True),   # the D=256 dQ row
]


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs an sm90 GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", HOPPER_CASES, ids=str)
def test_hopper_and_portable_kernels_agree(case, dtype):
    problem = make_problem(case, dtype, "cuda", seed=6)
    tolerance = GRAD_TOLERANCES[dtype]
    hopper = run_backward(problem, deterministic=True, kernel="sm90")
    portable = run_backward(problem, deterministic=True, kernel="portable")
    check_gradients(problem, hopper, tolerance)
    check_gradients(problem, portable, tolerance)
    for a, b in zip(hopper, portable):
        assert relative_error(a, b.double()) < tolerance


# The fused Hopper backward (sm90_bwd_fused.py) runs non-deterministic calls it supports:
# seqlen_q a multiple of 4 (lse is read by TMA), padded D = 64 or 128.
FUSED_CASES = [
    BackwardCase(2, 1000, 1100, 8, 2, 128, 128, causal=True),   # GQA, causal with Sq != Sk
    BackwardCase(1, 3000, 20, 4, 2, 128, 128, causal=True),     # rows that see no key
    BackwardCase(1, 20, 3000, 4, 1, 96, 96, causal=True),       # padded head dim
    BackwardCase(2, 1028, 999, 4, 4, 128, 128),
    BackwardCase(2, 1000, 1100, 8, 2, 64, 64, causal=True),
    BackwardCase(1, 500, 700, 2, 2, 48, 48),                    # pads to 64
]


def _runs_the_fused_kernel(problem) -> bool:
    from tileattn.arch import arch_of
    from tileattn.kernels.attention import bwd, sm90_bwd_fused
    case = problem.case
    delta, dq_accum = bwd.backward_workspace(problem.q, problem.lse, False)
    launches = bwd.backward_launches(
        problem.q, problem.k, problem.v, problem.out, problem.lse, problem.dout, problem.q,
        problem.k, problem.v, delta, dq_accum, causal=case.causal,
        softmax_scale=problem.softmax_scale, window_left=-1, window_right=-1,
        cu_seqlens_q=problem.cu_seqlens_q, cu_seqlens_k=problem.cu_seqlens_k,
        max_seqlen_q=problem.max_seqlen_q, max_seqlen_k=problem.max_seqlen_k,
        arch=arch_of(problem.q.device), kernel="sm90")
    return sm90_bwd_fused.attention_bwd_fused_sm90_kernel in [x.kernel for x in launches]


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs an sm90 GPU")
@pytest.mark.parametrize("case", FUSED_CASES, ids=str)
def test_hopper_fused_backward(case):
    problem = make_problem(case, torch.bfloat16, "cuda", seed=7)
    assert _runs_the_fused_kernel(problem)
    grads = run_backward(problem, deterministic=False, kernel="sm90")
    check_gradients(problem, grads, GRAD_TOLERANCES[torch.bfloat16])


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs an sm90 GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dims", [(64, 64), (96, 96), (128, 128)], ids=lambda d: f"D{d[0]}")
def test_hopper_fused_backward_varlen(head_dims, causal):
    # Packed: empty and one-token sequences, Sq > Sk (rows that see no key), lengths that
    # end inside tiles (the next sequence's rows and keys are in them), sequence starts that
    # are not multiples of 4 (lse rows TMA could not address).
    case = BackwardCase(0, 0, 0, 8, 2, *head_dims, causal=causal)
    problem = make_varlen_problem(case, [1000, 0, 1, 3000, 517, 64], [1200, 77, 1, 2900, 0, 64],
                                  torch.bfloat16, "cuda", seed=3)
    assert _runs_the_fused_kernel(problem)
    grads = run_backward(problem, deterministic=False, kernel="sm90")
    check_gradients(problem, grads, GRAD_TOLERANCES[torch.bfloat16])
