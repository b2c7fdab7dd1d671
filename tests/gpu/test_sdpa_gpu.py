"""SDPA with tileattn in its flash slot against torch's own flash kernels, on CUDA.

Unmodified F.scaled_dot_product_attention (and torch.nn.attention.varlen.varlen_attn) calls run
with tileattn active and with torch's kernels restored; outputs and gradients are compared with
an fp64 math-backend reference. FA3's yardstick: with tileattn active the error may be at most
twice the error of torch's flash kernels, plus one rounding unit of the dtype; forward and
backward both run tileattn's kernels while it is active. Skipped without CUDA or without
torch's flash-attention registry.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tileattn
from tileattn.integrations import sdpa
from tileattn.reference import attention_varlen_reference

from ..integration_helpers import ROUNDING_UNIT, counting, relative_error

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not hasattr(torch.nn.attention, "register_flash_attention_impl"),
                       reason="torch has no flash-attention registry"),
]

HEAD_DIMS = [64, 96, 128, 192, 256]
# (batch, num_q_heads, num_kv_heads, seqlen_q, seqlen_k); causal runs only where Sq == Sk,
# since SDPA's is_causal aligns top-left and its flash backend refuses Sq != Sk with it.
SHAPES = [(2, 8, 8, 1000, 1000), (1, 4, 4, 4097, 4097), (3, 8, 8, 1, 4097), (2, 4, 4, 17, 3000),
          (2, 8, 2, 777, 777)]


@pytest.fixture
def tileattn_calls(monkeypatch):
    """tileattn.attention's calls while the test runs; torch's kernels restored afterwards."""
    monkeypatch.setattr(tileattn, "attention", counting(tileattn.attention))
    monkeypatch.setattr(tileattn, "attention_varlen", counting(tileattn.attention_varlen))
    yield tileattn.attention.calls
    sdpa.restore()


def make_inputs(shape, head_dim, dtype, seed):
    batch, num_q_heads, num_kv_heads, seqlen_q, seqlen_k = shape
    gen = torch.Generator(device="cuda").manual_seed(seed)
    def randn(*size):
        return torch.randn(*size, device="cuda", generator=gen).to(dtype)
    q = randn(batch, num_q_heads, seqlen_q, head_dim)
    k = randn(batch, num_kv_heads, seqlen_k, head_dim)
    v = randn(batch, num_kv_heads, seqlen_k, head_dim)
    return q, k, v, randn(batch, num_q_heads, seqlen_q, head_dim)


def run_sdpa(q, k, v, grad_out, causal, backend, dropout_p=0.0):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    with sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=dropout_p,
                                             enable_gqa=q.shape[1] != k.shape[1])
    out.backward(grad_out.to(out.dtype))
    return out.detach(), q.grad, k.grad, v.grad


def compare_active_and_restored(q, k, v, grad_out, causal, calls):
    reference = run_sdpa(*(x.double() for x in (q, k, v, grad_out)), causal, SDPBackend.MATH)
    try:
        restored = run_sdpa(q, k, v, grad_out, causal, SDPBackend.FLASH_ATTENTION)
    except RuntimeError as error:
        if "No available kernel" in str(error):
            pytest.skip(f"torch's flash backend does not take this input: {error}")
        raise
    sdpa.activate()
    active = run_sdpa(q, k, v, grad_out, causal, SDPBackend.FLASH_ATTENTION)
    sdpa.restore()
    assert calls, "SDPA's flash slot did not reach tileattn"
    ran = len(calls)
    assert torch.equal(run_sdpa(q, k, v, grad_out, causal, SDPBackend.FLASH_ATTENTION)[0],
                       restored[0]) and len(calls) == ran, "restore() left tileattn in place"
    for name, got, torchs, ref in zip(("out", "dq", "dk", "dv"), active, restored, reference):
        assert torch.isfinite(got).all(), name
        bound = 2 * relative_error(torchs, ref) + ROUNDING_UNIT[q.dtype]
        assert relative_error(got, ref) <= bound, name


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_every_head_dim(dtype, head_dim, causal, tileattn_calls):
    q, k, v, grad_out = make_inputs(SHAPES[0], head_dim, dtype, seed=head_dim)
    compare_active_and_restored(q, k, v, grad_out, causal, tileattn_calls)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES[1:], ids=lambda s: "x".join(map(str, s)))
def test_shapes(shape, causal, tileattn_calls):
    if causal and shape[3] != shape[4]:
        pytest.skip("SDPA's flash backend takes is_causal only with Sq == Sk")
    q, k, v, grad_out = make_inputs(shape, 128, torch.bfloat16, seed=sum(shape))
    compare_active_and_restored(q, k, v, grad_out, causal, tileattn_calls)


def test_inputs_tileattn_does_not_take_run_torchs_kernel(tileattn_calls):
    """Head dim 80 (flash takes it, tileattn does not) and dropout: torch's own kernel runs."""
    q, k, v, grad_out = make_inputs(SHAPES[0], 80, torch.bfloat16, seed=80)
    restored = run_sdpa(q, k, v, grad_out, True, SDPBackend.FLASH_ATTENTION)
    sdpa.activate()
    active = run_sdpa(q, k, v, grad_out, True, SDPBackend.FLASH_ATTENTION)
    q, k, v, grad_out = make_inputs(SHAPES[0], 128, torch.bfloat16, seed=1)
    dropped = run_sdpa(q, k, v, grad_out, True, SDPBackend.FLASH_ATTENTION, dropout_p=0.3)
    sdpa.restore()
    assert not tileattn_calls
    assert torch.equal(active[0], restored[0])
    for got, torchs in zip(active[1:], restored[1:]):
        torch.testing.assert_close(got, torchs)
    assert all(torch.isfinite(x).all() for x in dropped)


def test_restore_gives_back_torchs_kernels(tileattn_calls):
    ops = [op for op in ("_scaled_dot_product_flash_attention",
                         "_scaled_dot_product_flash_attention_backward",
                         "_flash_attention_forward", "_flash_attention_forward_no_dropout_inplace",
                         "_flash_attention_backward")
           if hasattr(torch.ops.aten, op)]   # the in-place op is newer than torch 2.11
    before = [repr(torch.library.get_kernel(f"aten::{op}", "CUDA")) for op in ops]
    sdpa.activate()
    assert all("tileattn" in repr(torch.library.get_kernel(f"aten::{op}", "CUDA")) for op in ops)
    sdpa.restore()
    assert [repr(torch.library.get_kernel(f"aten::{op}", "CUDA")) for op in ops] == before


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (127, 0)])
def test_varlen_attn(window, tileattn_calls):
    """torch.nn.attention.varlen.varlen_attn (packed sequences, its own autograd through
    aten::_flash_attention_backward) with tileattn active vs restored vs fp64."""
    import inspect
    from torch.nn.attention.varlen import varlen_attn
    if "enable_gqa" not in inspect.signature(varlen_attn).parameters:
        pytest.skip(f"torch {torch.__version__}'s varlen_attn has no GQA (enable_gqa)")
    lengths = [1000, 17, 2049, 333]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(7)
    total = sum(lengths)
    q = torch.randn(total, 8, 128, device="cuda", generator=gen).bfloat16()
    k, v = (torch.randn(total, 2, 128, device="cuda", generator=gen).bfloat16() for _ in range(2))
    grad_out = torch.randn(total, 8, 128, device="cuda", generator=gen).bfloat16()

    def run(dtype, function):
        leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
        out = function(*leaves)
        out.backward(grad_out.to(out.dtype))
        return out.detach(), *(x.grad for x in leaves)

    def torch_varlen(q, k, v):
        return varlen_attn(q, k, v, cu, cu, max(lengths), max(lengths), window_size=window,
                           enable_gqa=True)

    def reference(q, k, v):
        return attention_varlen_reference(q, k, v, cu, cu, window_size=window)[0]
    ref = run(torch.float64, reference)
    restored = run(torch.bfloat16, torch_varlen)
    sdpa.activate()
    active = run(torch.bfloat16, torch_varlen)
    sdpa.restore()
    assert tileattn.attention_varlen.calls, "varlen_attn did not reach tileattn"
    for name, got, torchs, expected in zip(("out", "dq", "dk", "dv"), active, restored, ref):
        bound = 2 * relative_error(torchs, expected) + ROUNDING_UNIT[torch.bfloat16]
        assert relative_error(got, expected) <= bound, name
