"""Problems for the attention backward tests (CPU interpreter and GPU): random inputs, the
forward's out/lse and the fp64 autograd gradients from tileattn/reference.py, and one call of
the backward launcher with the built-in hooks of tileattn/kernels/mods.py."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tileattn import dispatch
from tileattn.arch import arch_of
from tileattn.kernels import mods
from tileattn.kernels.attention.bwd import attention_backward
from tileattn.reference import attention_reference, attention_varlen_reference


@dataclass(frozen=True)
class BackwardCase:
    batch: int
    seqlen_q: int
    seqlen_k: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int = 64
    head_dim_v: int = 64
    causal: bool = False
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0
    alibi: bool = False

    def __str__(self) -> str:
        text = (f"b{self.batch}-q{self.seqlen_q}-k{self.seqlen_k}-h{self.num_q_heads}"
                f"/{self.num_kv_heads}-d{self.head_dim}/{self.head_dim_v}")
        if self.causal:
            text += "-causal"
        if (self.window_left, self.window_right) != (-1, -1):
            text += f"-window{self.window_left},{self.window_right}"
        if self.softcap:
            text += f"-softcap{self.softcap:g}"
        return text + ("-alibi" if self.alibi else "")


@dataclass
class Problem:
    case: BackwardCase
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    out: torch.Tensor           # the forward's output in the input dtype
    lse: torch.Tensor           # float32, natural log
    dout: torch.Tensor
    expected: tuple             # fp64 (dq, dk, dv) from autograd
    slopes: torch.Tensor | None
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    max_seqlen_q: int | None = None
    max_seqlen_k: int | None = None

    @property
    def softmax_scale(self) -> float:
        return 1.0 / math.sqrt(self.case.head_dim)


def alibi_slopes(num_heads: int, batch: int | None, device) -> torch.Tensor:
    """ALiBi's geometric slopes 2^(-8(h+1)/H); with a batch, scaled per sequence so that a
    kernel mixing up sequences would be caught ([batch, H]); without one, [H]."""
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / num_heads) for h in range(num_heads)])
    if batch is not None:
        slopes = slopes[None, :] * torch.linspace(1.0, 2.0, batch)[:, None]
    return slopes.to(device)


def hooks(case: BackwardCase, slopes: torch.Tensor | None) -> dict:
    """score_mod, score_mod_grad and mod_args (mods.builtin's) for the case."""
    if not case.softcap and not case.alibi:
        return {}
    score_mod, score_mod_grad, mod_args = mods.builtin(float(case.softcap), slopes)
    return dict(score_mod=score_mod, score_mod_grad=score_mod_grad, mod_args=mod_args)


def _reference_options(case: BackwardCase) -> dict:
    return dict(causal=case.causal, softmax_scale=1.0 / math.sqrt(case.head_dim),
                window_size=(case.window_left, case.window_right), softcap=case.softcap)


def _finish(case, q, k, v, dout, dtype, reference, slopes, **varlen) -> Problem:
    """Run the fp64 reference forward and backward on the (rounded) inputs."""
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    out, lse = reference(*leaves, alibi_slopes=slopes)
    expected = torch.autograd.grad(out, leaves, dout.double())
    return Problem(case, q, k, v, out.detach().to(dtype), lse.detach().float(), dout, expected,
                   slopes, **varlen)


def make_problem(case: BackwardCase, dtype, device, seed: int = 0) -> Problem:
    """Dense inputs q [B, Sq, Hq, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv], normal random."""
    gen = torch.Generator().manual_seed(seed)
    shapes = ((case.batch, case.seqlen_q, case.num_q_heads, case.head_dim),
              (case.batch, case.seqlen_k, case.num_kv_heads, case.head_dim),
              (case.batch, case.seqlen_k, case.num_kv_heads, case.head_dim_v),
              (case.batch, case.seqlen_q, case.num_q_heads, case.head_dim_v))
    q, k, v, dout = (torch.randn(shape, generator=gen).to(device=device, dtype=dtype) for shape in shapes)
    slopes = alibi_slopes(case.num_q_heads, case.batch, device) if case.alibi else None
    reference = lambda *x, alibi_slopes: attention_reference(*x, alibi_slopes=alibi_slopes,
                                                             **_reference_options(case))
    return _finish(case, q, k, v, dout, dtype, reference, slopes)


def make_varlen_problem(case: BackwardCase, seqlens_q: list[int], seqlens_k: list[int], dtype,
                        device, seed: int = 0) -> Problem:
    """Packed inputs q [total_q, Hq, D], k/v [total_k, Hkv, D|Dv]; case.batch, seqlen_q and
    seqlen_k are ignored (the lengths given are used); ALiBi slopes [Hq]."""
    gen = torch.Generator().manual_seed(seed)
    total_q, total_k = sum(seqlens_q), sum(seqlens_k)
    shapes = ((total_q, case.num_q_heads, case.head_dim), (total_k, case.num_kv_heads, case.head_dim),
              (total_k, case.num_kv_heads, case.head_dim_v), (total_q, case.num_q_heads, case.head_dim_v))
    q, k, v, dout = (torch.randn(shape, generator=gen).to(device=device, dtype=dtype) for shape in shapes)
    cumulative = lambda lengths: torch.tensor([0] + lengths, device=device).cumsum(0).to(torch.int32)
    cu_seqlens_q, cu_seqlens_k = cumulative(seqlens_q), cumulative(seqlens_k)
    slopes = alibi_slopes(case.num_q_heads, None, device) if case.alibi else None
    reference = lambda *x, alibi_slopes: attention_varlen_reference(
        *x, cu_seqlens_q, cu_seqlens_k, alibi_slopes=alibi_slopes, **_reference_options(case))
    return _finish(case, q, k, v, dout, dtype, reference, slopes, cu_seqlens_q=cu_seqlens_q,
                   cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max(seqlens_q),
                   max_seqlen_k=max(seqlens_k))


def eager_gradients(problem: Problem):
    """(dq, dk, dv) of a plain PyTorch attention on the dense problem's inputs in their own
    dtype (scores and P @ V in the dtype, softmax in fp32): the error a framework's unfused
    backward makes at this precision, the yardstick for GRAD_TOLERANCES."""
    case = problem.case
    leaves = [x.clone().requires_grad_() for x in (problem.q, problem.k, problem.v)]
    q, k, v = leaves
    group = case.num_q_heads // case.num_kv_heads
    k, v = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * problem.softmax_scale
    if case.softcap:
        scores = case.softcap * torch.tanh(scores / case.softcap)
    aligned = (torch.arange(case.seqlen_q, device=q.device)[:, None]
               + case.seqlen_k - case.seqlen_q)
    keys = torch.arange(case.seqlen_k, device=q.device)[None, :]
    if case.alibi:
        penalty = problem.slopes[:, :, None, None] * (aligned - keys).abs()
        scores = scores - penalty.to(scores.dtype)
    hidden = torch.zeros(case.seqlen_q, case.seqlen_k, dtype=torch.bool, device=q.device)
    if case.window_left >= 0:
        hidden |= keys < aligned - case.window_left
    if case.causal or case.window_right >= 0:
        hidden |= keys > aligned + (0 if case.causal else case.window_right)
    scores = scores.masked_fill(hidden, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).nan_to_num(0.0).to(q.dtype)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v)
    return torch.autograd.grad(out, leaves, problem.dout)


def poisoned_like(x: torch.Tensor) -> torch.Tensor:
    """NaN-filled, so that an element the kernels never write is caught."""
    return torch.full_like(x, float("nan"))


def run_backward(problem: Problem, dq=None, dk=None, dv=None, *, deterministic=False, q=None,
                 k=None, v=None, kernel=None):
    """The launcher on the problem's inputs (or the strided views q/k/v given for them),
    writing into dq/dk/dv (poisoned fresh tensors unless given), with the kernels `kernel`
    names or else the ones dispatch picks for the device (what attention()'s backward runs).
    Returns (dq, dk, dv)."""
    case = problem.case
    arch = arch_of(problem.q.device)
    kernel = kernel or dispatch.backward_kernel(arch, dispatch.current())
    q, k, v = (problem.q if q is None else q, problem.k if k is None else k,
               problem.v if v is None else v)
    dq, dk, dv = (poisoned_like(x) if given is None else given
                  for x, given in ((q, dq), (k, dk), (v, dv)))
    attention_backward(
        q, k, v, problem.out, problem.lse, problem.dout, dq, dk, dv, causal=case.causal,
        softmax_scale=problem.softmax_scale, window_left=case.window_left,
        window_right=case.window_right, cu_seqlens_q=problem.cu_seqlens_q,
        cu_seqlens_k=problem.cu_seqlens_k, max_seqlen_q=problem.max_seqlen_q,
        max_seqlen_k=problem.max_seqlen_k, deterministic=deterministic, arch=arch,
        kernel=kernel, **hooks(case, problem.slopes))
    return dq, dk, dv


def relative_error(x: torch.Tensor, expected: torch.Tensor) -> float:
    return float((x.double() - expected).norm() / expected.norm())


def check_gradients(problem: Problem, grads, tolerance: float) -> list[float]:
    """Every gradient finite, within `tolerance` (relative L2) of fp64 autograd, and exactly 0
    where nothing is seen: dq on rows that see no key (lse -inf), dk and dv on keys that no
    query sees (the reference's dv row exactly 0). Returns the three errors."""
    lse = problem.lse
    unseen_rows = torch.isinf(lse.t() if problem.cu_seqlens_q is not None else lse.transpose(1, 2))
    unseen_keys = (problem.expected[2] == 0).all(-1)
    errors = []
    for name, grad, expected, unseen in zip(("dq", "dk", "dv"), grads, problem.expected,
                                            (unseen_rows, unseen_keys, unseen_keys)):
        assert torch.isfinite(grad).all(), f"{name} has NaN/inf (unwritten or masked wrongly)"
        assert torch.all(grad[unseen] == 0), f"{name} is not 0 where nothing is seen"
        errors.append(relative_error(grad, expected))
        assert errors[-1] < tolerance, f"{name}: relative error {errors[-1]:.3g} >= {tolerance}"
    return errors
