"""tileattn in SDPA's flash slot, on the CPU.

SDPA dispatches to its flash backend only on CUDA (tests/gpu/test_sdpa_gpu.py checks that path
end to end). Here: the registry bookkeeping (activate, restore, idempotence, the dispatcher's
CUDA kernels), and the registered kernels called directly with CPU tensors through tileattn in
the interpreter, against the fp64 reference, with the return conventions of torch's own flash
ops (their meta functions in torch/_meta_registrations.py).
"""

from __future__ import annotations

import logging

import pytest
import torch

import tileattn
from tileattn.integrations import sdpa
from tileattn.reference import attention_reference, attention_varlen_reference

from .conftest import GRAD_TOLERANCES, LSE_TOLERANCES, TOLERANCES
from .integration_helpers import counting, relative_error

attention_api = pytest.importorskip("torch.nn.attention")
pytestmark = pytest.mark.skipif(not hasattr(attention_api, "register_flash_attention_impl"),
                                reason="torch has no flash-attention registry")

OPS = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
       "_flash_attention_forward", "_flash_attention_forward_no_dropout_inplace",
       "_flash_attention_backward")


def cuda_kernel_description(op):
    try:
        return repr(torch.library.get_kernel(f"aten::{op}", "CUDA"))
    except RuntimeError as error:   # a CPU build has no CUDA kernel of its own
        return str(error)


@pytest.fixture
def restored():
    yield
    sdpa.restore()


def test_activate_restore_bookkeeping(restored, caplog):
    before = {op: cuda_kernel_description(op) for op in OPS}
    sdpa.activate()
    sdpa.activate()   # idempotent: one registration, still active
    assert sdpa.is_active() and attention_api.current_flash_attention_impl() == sdpa.IMPL_NAME
    assert sdpa.IMPL_NAME in attention_api.list_flash_attention_impls()
    for op in OPS:
        assert "tileattn/integrations/sdpa.py" in cuda_kernel_description(op)
        rows = [row for row in torch._C._dispatch_dump_table(f"aten::{op}").splitlines()
                if row.startswith("CUDA:")]
        assert len(rows) == 1
    sdpa.restore()
    assert not sdpa.is_active() and attention_api.current_flash_attention_impl() is None
    assert {op: cuda_kernel_description(op) for op in OPS} == before
    with caplog.at_level(logging.WARNING):
        sdpa.restore()   # nothing active: no-op, no warning from torch's registry
    assert not caplog.records
    assert sdpa.register() == sdpa.IMPL_NAME and not sdpa.is_active()


def test_torch_without_the_registry_gets_a_clear_error(monkeypatch):
    monkeypatch.delattr(attention_api, "register_flash_attention_impl")
    with pytest.raises(RuntimeError, match=r"needs a torch that has it"):
        sdpa.activate()


def bhsd(batch, heads, seqlen, head_dim, dtype, bshd_memory=False):
    if bshd_memory:   # a [B, S, H, D] buffer seen as [B, H, S, D], as from a fused projection
        return torch.randn(batch, seqlen, heads, head_dim, dtype=dtype).transpose(1, 2)
    return torch.randn(batch, heads, seqlen, head_dim, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal, seqlen_q, seqlen_k, bshd_memory",
                         [(False, 13, 37, False), (True, 29, 29, True), (True, 1, 19, False)])
def test_sdpa_flash_forward_returns_torchs_conventions(dtype, causal, seqlen_q, seqlen_k,
                                                       bshd_memory):
    torch.manual_seed(0)
    query = bhsd(2, 4, seqlen_q, 64, dtype, bshd_memory)
    key, value = (bhsd(2, 2, seqlen_k, 64, dtype, bshd_memory) for _ in range(2))  # GQA 4/2
    result = sdpa.scaled_dot_product_flash_attention(None, query, key, value, 0.0, causal, False,
                                                     scale=0.1)
    out, lse, cum_q, cum_k, max_q, max_k, seed, offset, debug = result
    assert out.shape == query.shape and out.dtype == dtype
    assert out.stride() == torch.empty_like(query).stride()
    assert lse.shape == (2, 4, seqlen_q) and lse.dtype == torch.float32 and lse.is_contiguous()
    assert cum_q is None and cum_k is None and (max_q, max_k) == (seqlen_q, seqlen_k)
    assert seed.shape == (2,) and seed.dtype == torch.uint64 and offset.shape == ()
    assert offset.dtype == torch.uint64 and debug.numel() == 0
    expected, expected_lse = attention_reference(*(x.transpose(1, 2) for x in (query, key, value)),
                                                 causal=causal, softmax_scale=0.1)
    assert relative_error(out.transpose(1, 2), expected) <= TOLERANCES[dtype]
    lse_error = (lse - expected_lse).abs() / expected_lse.abs().clamp(min=1)
    assert lse_error.max() <= LSE_TOLERANCES[dtype]


def test_flash_forward_dense_and_in_place():
    torch.manual_seed(1)
    q = torch.randn(2, 21, 2, 128, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 33, 1, 128, dtype=torch.bfloat16) for _ in range(2))
    out, lse, seed, offset, debug = sdpa.flash_attention_forward(
        None, q, k, v, None, None, 21, 33, 0.0, True, False)
    expected, _ = attention_reference(q, k, v, causal=True)
    assert out.shape == q.shape and lse.shape == (2, 2, 21)
    assert relative_error(out, expected) <= TOLERANCES[torch.bfloat16]
    buffer = torch.full_like(q, float("nan"))    # poisoned: every element must be written
    lse_in_place = sdpa.flash_attention_forward_no_dropout_inplace(
        None, buffer, q, k, v, None, None, 21, 33, 0.0, True, False)
    assert torch.equal(buffer, out) and torch.equal(lse_in_place, lse)


def test_a_query_that_sees_no_key_gets_lse_plus_infinity():
    """Causal with Sq > Sk, aligned bottom-right: the first Sq - Sk queries see nothing. Their
    output is 0 and their lse +inf, so FlashAttention's backward gives them P = 0."""
    q = torch.randn(1, 9, 2, 64, dtype=torch.float16)
    k, v = (torch.randn(1, 5, 2, 64, dtype=torch.float16) for _ in range(2))
    out, lse, *_ = sdpa.flash_attention_forward(None, q, k, v, None, None, 9, 5, 0.0, True, False)
    assert torch.all(lse[:, :, :4] == float("inf")) and torch.isfinite(lse[:, :, 4:]).all()
    assert torch.all(out[:, :4] == 0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal, seqlen_q, seqlen_k", [(False, 13, 21), (True, 19, 19),
                                                        (True, 9, 5)])
def test_sdpa_flash_backward_matches_fp64_autograd(dtype, causal, seqlen_q, seqlen_k):
    """The forward's out and logsumexp (+inf rows included: causal Sq > Sk) through tileattn's
    backward kernels, against fp64 autograd; gradients keep query's/key's/value's strides."""
    torch.manual_seed(4)
    query = bhsd(2, 4, seqlen_q, 64, dtype, bshd_memory=True)
    key, value = (bhsd(2, 2, seqlen_k, 64, dtype) for _ in range(2))
    forward = sdpa.scaled_dot_product_flash_attention(None, query, key, value, 0.0, causal,
                                                      False, scale=0.1)
    out, lse, seed, offset = forward[0], forward[1], forward[6], forward[7]
    grad_out = torch.randn_like(out)
    grads = sdpa.scaled_dot_product_flash_attention_backward(
        None, grad_out, query, key, value, out, lse, None, None, seqlen_q, seqlen_k, 0.0, causal,
        seed, offset, scale=0.1)
    leaves = [x.transpose(1, 2).double().requires_grad_() for x in (query, key, value)]
    expected, _ = attention_reference(*leaves, causal=causal, softmax_scale=0.1)
    expected.backward(grad_out.transpose(1, 2).double())
    for grad, leaf, x in zip(grads, leaves, (query, key, value)):
        assert grad.stride() == torch.empty_like(x).stride() and grad.dtype == dtype
        assert relative_error(grad.transpose(1, 2), leaf.grad) <= GRAD_TOLERANCES[dtype]


def test_packed_backward_with_a_window_matches_fp64_autograd():
    torch.manual_seed(5)
    lengths = [7, 1, 16]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(lengths), 4, 64, dtype=torch.bfloat16)
    k, v = (torch.randn(sum(lengths), 2, 64, dtype=torch.bfloat16) for _ in range(2))
    window = dict(window_size_left=3, window_size_right=0)
    out, lse, rng_state, unused, _ = sdpa.flash_attention_forward(
        None, q, k, v, cu, cu, 16, 16, 0.0, True, False, **window)
    grad_out = torch.randn_like(out)
    grads = sdpa.flash_attention_backward(None, grad_out, q, k, v, out, lse, cu, cu, 16, 16, 0.0,
                                          True, rng_state, unused, **window)
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    expected, _ = attention_varlen_reference(*leaves, cu, cu, causal=True, window_size=(3, 0))
    expected.backward(grad_out.double())
    for grad, leaf in zip(grads, leaves):
        assert relative_error(grad, leaf.grad) <= GRAD_TOLERANCES[torch.bfloat16]


def test_inputs_that_require_grad_are_taken_below_autograd():
    """The kernels run under SDPA's autograd node, which owns the gradient."""
    q, k, v = (torch.randn(1, 2, 7, 64, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    out = sdpa.scaled_dot_product_flash_attention(None, q, k, v, 0.0, True, False)[0]
    assert not out.requires_grad


def test_windows_and_alibi():
    """FlashAttention's window (None/-1 unbounded; a causal right bound of 0 is causal itself)
    and ALiBi slopes reach tileattn.attention as window_size and alibi_slopes."""
    torch.manual_seed(3)
    q = torch.randn(2, 17, 4, 64, dtype=torch.float16)
    k, v = (torch.randn(2, 23, 2, 64, dtype=torch.float16) for _ in range(2))
    slopes = torch.rand(4, dtype=torch.float32)
    for causal, left, right, alibi in ((True, 5, 0, None), (False, 3, 2, slopes),
                                       (True, -1, 0, slopes), (False, None, None, None)):
        out, lse, *_ = sdpa.flash_attention_forward(
            None, q, k, v, None, None, 17, 23, 0.0, causal, False, window_size_left=left,
            window_size_right=right, alibi_slopes=alibi)
        window = (-1 if left is None else left, -1 if right is None else right)
        expected, _ = attention_reference(q, k, v, causal=causal, window_size=window,
                                          alibi_slopes=alibi)
        assert relative_error(out, expected) <= TOLERANCES[torch.float16], (causal, left, right)


@pytest.mark.parametrize("window", [(-1, -1), (5, 0)])
@pytest.mark.parametrize("paged", [False, True])
def test_packed_sequences_through_varlen(window, paged):
    """cu_seqlens (torch.nn.attention.varlen's path) go to attention_varlen; its logsumexp is
    FlashAttention's [H, total_q]. Paged: k/v in a cache of 4-key pages through block_table."""
    torch.manual_seed(2)
    lengths_q, lengths_k = [5, 1, 12], [9, 14, 12]
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32)
                  for n in (lengths_q, lengths_k))
    q = torch.randn(sum(lengths_q), 4, 64, dtype=torch.bfloat16)
    k, v = (torch.randn(sum(lengths_k), 2, 64, dtype=torch.bfloat16) for _ in range(2))
    k_in, v_in, block_table = k, v, None
    if paged:   # 4 keys per page, each sequence's pages shuffled; unused slots poisoned (NaN)
        block_table = torch.randperm(12).view(3, 4).to(torch.int32)
        k_in, v_in = (torch.full((12, 4, 2, 64), float("nan"), dtype=torch.bfloat16)
                      for _ in range(2))
        for b, (start, length) in enumerate(zip(cu_k[:-1].tolist(), lengths_k)):
            rows = torch.arange(length)
            slots = (block_table[b].long()[rows // 4], rows % 4)
            k_in[slots], v_in[slots] = k[start:start + length], v[start:start + length]
    out, lse, *_ = sdpa.flash_attention_forward(None, q, k_in, v_in, cu_q, cu_k, 12, 14, 0.0,
                                                True, False, window_size_left=window[0],
                                                window_size_right=window[1],
                                                block_table=block_table)
    expected, expected_lse = attention_varlen_reference(q, k, v, cu_q, cu_k, causal=True,
                                                        window_size=window)
    assert out.shape == q.shape and lse.shape == (4, sum(lengths_q))
    assert relative_error(out, expected) <= TOLERANCES[torch.bfloat16]
    lse_error = (lse - expected_lse).abs() / expected_lse.abs().clamp(min=1)
    assert lse_error.max() <= LSE_TOLERANCES[torch.bfloat16]


class Recorder:
    """Stands in for the CUDA kernel tileattn replaced; records what it is handed."""

    def __init__(self):
        self.calls = []

    def call_boxed(self, keyset, *args, **kwargs):
        self.calls.append((keyset, args, kwargs))
        return "torch's result"


UNSUPPORTED = {
    "dropout": dict(dropout_p=0.1),
    "debug mask": dict(return_debug_mask=True),
    "head dim 80": dict(head_dim=80),
    "float32": dict(dtype=torch.float32),
    "seqused_k": dict(seqused_k=torch.tensor([5], dtype=torch.int32)),
    "paged dense": dict(block_table=torch.zeros(1, 1, dtype=torch.int32)),
}


@pytest.mark.parametrize("case", list(UNSUPPORTED))
def test_unsupported_calls_go_to_torchs_kernel(case, monkeypatch):
    settings = dict(dropout_p=0.0, return_debug_mask=False, head_dim=64, dtype=torch.float16)
    settings.update(UNSUPPORTED[case])
    extra = {name: settings.pop(name) for name in ("seqused_k", "block_table") if name in settings}
    recorders = {op: Recorder() for op in OPS}
    monkeypatch.setattr(sdpa, "_REPLACED", recorders)
    monkeypatch.setattr(tileattn, "attention", counting(tileattn.attention))
    q, k, v = (torch.randn(1, 5, 2, settings["head_dim"], dtype=settings["dtype"])
               for _ in range(3))
    flags = (settings["dropout_p"], False, settings["return_debug_mask"])
    if not extra:
        keyset = object()
        bhsd_inputs = (x.transpose(1, 2) for x in (q, k, v))
        assert sdpa.scaled_dot_product_flash_attention(keyset, *bhsd_inputs, *flags,
                                                       scale=0.5) == "torch's result"
        called = recorders["_scaled_dot_product_flash_attention"].calls
        assert called[0][0] is keyset and called[0][2] == {"scale": 0.5}
    assert sdpa.flash_attention_forward(None, q, k, v, None, None, 5, 5, *flags,
                                        **extra) == "torch's result"
    assert recorders["_flash_attention_forward"].calls[0][1][:3] == (q, k, v)
    if "block_table" not in extra and "seqused_k" not in extra and case != "debug mask":
        # the backward ops take neither; dropout, dtype and head dim decide them alike
        assert sdpa.flash_attention_backward(None, q, q, k, v, q, torch.zeros(1, 2, 5), None,
                                             None, 5, 5, settings["dropout_p"], False, None,
                                             None) == "torch's result"
    assert not tileattn.attention.calls
    monkeypatch.setattr(sdpa, "_REPLACED", {})   # a build without CUDA kernels: a clear error
    with pytest.raises(RuntimeError, match="does not take this"):
        sdpa.flash_attention_forward(None, q, k, v, None, None, 5, 5, *flags, **extra)
