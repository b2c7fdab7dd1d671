"""The Hopper Gluon kernel (tileattn.kernels.attention.sm90) against the fp64 reference, on an
sm90 GPU: bf16 and fp16, every head-dim family (64, 128, 256, padded 96/192, Dv != D), causal or
not, ping-pong and lockstep consumers, GQA, odd and unequal lengths. Skipped elsewhere.

The fast tier (the default run) takes one case per dtype, head-dim family, causal flag and
feature, on shapes whose integer arguments Triton specializes alike, so that it compiles few
kernels; `pytest --full` adds the cross product (tests marked `full`).
"""

import dataclasses

import pytest
import torch

import tileattn
from tileattn import dispatch
from tileattn.kernels.attention import sm90
from tileattn.ops import attention as attention_op
from tileattn.reference import attention_reference

from ..conftest import GRAD_TOLERANCES, LSE_TOLERANCES, TOLERANCES

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm90 GPU")

DTYPES = [torch.bfloat16, torch.float16]
HEAD_DIMS = [64, 128, 256]
# (batch, seqlen_q, seqlen_k, num_q_heads, num_kv_heads). No size is 1 or a multiple of 16, so
# these share one compiled specialization per dtype / head dims / causal / consumer structure.
SHAPE = (2, 1000, 1500, 8, 2)
# The full grid's shapes: single queries, tiny and long sequences, more queries than keys.
SHAPES = [(1, 1, 1, 2, 1), (2, 17, 17, 4, 2), (2, 1000, 1000, 8, 2), (1, 4097, 4097, 2, 2),
          (3, 1, 4097, 8, 1), (1, 17, 3000, 4, 2), (1, 3000, 17, 4, 2), (2, 1000, 1024, 8, 2),
          (1, 33, 4096, 4, 1), (1, 3000, 64, 4, 4)]
PADDED_DIMS = [(192, 128), (96, 96), (192, 192), (128, 64), (64, 256)]


def run_sm90(q, k, v, causal, split=None, with_lse=True, config=None, **masks):
    """out, lse of the sm90 kernel, both poisoned with NaN first so that unwritten elements
    fail the comparison (lse None without with_lse). split: force the ping-pong (True) or
    lockstep (False) consumers; config: a config row (default: CONFIGS'); masks:
    attention_sm90_launch's softcap / window_left."""
    assert sm90.supports(q, k, v, causal)
    batch, seqlen_q, num_q_heads, _ = q.shape
    out = torch.full((batch, seqlen_q, num_q_heads, v.shape[3]), float("nan"), device=q.device,
                     dtype=q.dtype)
    lse = (torch.full((batch, num_q_heads, seqlen_q), float("nan"), device=q.device)
           if with_lse else None)
    config = config or sm90.config_for(q.shape[3], v.shape[3])
    if split is not None:
        config = dataclasses.replace(config, split=split)
    sm90.attention_sm90_launch(q, k, v, out, lse, q.shape[3] ** -0.5, causal, config=config,
                               **masks).run()
    return out, lse


def make_inputs(shape, head_dim, dtype, head_dim_v=None):
    batch, seqlen_q, seqlen_k, num_q_heads, num_kv_heads = shape
    gen = torch.Generator(device="cuda").manual_seed(sum(shape) + head_dim)
    q = torch.randn(batch, seqlen_q, num_q_heads, head_dim, device="cuda", generator=gen)
    k = torch.randn(batch, seqlen_k, num_kv_heads, head_dim, device="cuda", generator=gen)
    v = torch.randn(batch, seqlen_k, num_kv_heads, head_dim_v or head_dim, device="cuda",
                    generator=gen)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def assert_close(out, lse, q, k, v, causal, **masks):
    """out and lse against the fp64 reference (masks: its softcap / window_size)."""
    ref, ref_lse = attention_reference(q, k, v, causal=causal, **masks)
    assert not out.isnan().any()
    if ref.norm() == 0:
        assert out.abs().max() == 0
    else:
        error = float((out.double() - ref).norm() / ref.norm())
        assert error < TOLERANCES[q.dtype], error
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    assert ((lse.double() - ref_lse)[finite].abs() / ref_lse[finite].abs().clamp(min=1)).max() \
        < LSE_TOLERANCES[q.dtype]


def record_launches(monkeypatch, keyword):
    """The list that each attention_sm90_launch call appends its `keyword` argument to (a call
    cache replay runs the first call's bound launch: it builds none)."""
    launched = []
    original = sm90.attention_sm90_launch
    monkeypatch.setattr(sm90, "attention_sm90_launch",
                        lambda *a, **kw: launched.append(kw.get(keyword)) or original(*a, **kw))
    return launched


def assert_gradients_close(q_scale, **masks):
    """Gradients of tileattn.attention(q_scale * q, k, v, **masks) (bf16, SHAPE, D=128; the
    portable backward kernels) against fp64 autograd of the reference."""
    q, k, v = (x.detach().requires_grad_() for x in make_inputs(SHAPE, 128, torch.bfloat16))
    out = tileattn.attention(q * q_scale, k, v, **masks)
    grad = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref, _ = attention_reference(q64 * q_scale, k64, v64, **masks)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), grad.double())
    for got, want in zip(grads, ref_grads):
        assert float((got.double() - want).norm() / want.norm()) < GRAD_TOLERANCES[torch.bfloat16]


def check(shape, head_dim, dtype, causal, split=None, head_dim_v=None):
    q, k, v = make_inputs(shape, head_dim, dtype, head_dim_v)
    out, lse = run_sm90(q, k, v, causal, split)
    assert_close(out, lse, q, k, v, causal)


# ---- fast tier -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, head_dim, head_dim_v, causal", [
    (torch.bfloat16, 128, 128, True), (torch.bfloat16, 128, 128, False),
    (torch.float16, 64, 64, True), (torch.float16, 256, 256, False),
    (torch.bfloat16, 192, 128, True), (torch.bfloat16, 96, 96, False),
], ids=lambda p: str(p).replace("torch.", ""))
def test_each_dtype_head_dim_and_mask(dtype, head_dim, head_dim_v, causal):
    """The default (ping-pong) consumers on one shape per dtype, head-dim family and mask,
    padded (96 -> 128, 192 -> 256) and Dv != D included."""
    check(SHAPE, head_dim, dtype, causal, head_dim_v=head_dim_v)


def test_lockstep_consumers():
    """The one 8-warp consumer partition (split=False) instead of the ping-pong pair."""
    check(SHAPE, 128, torch.bfloat16, True, split=False)


@pytest.mark.parametrize("shape", [(3, 1, 4097, 8, 1), (1, 3000, 17, 4, 2)],
                         ids=["one-query", "more-queries-than-keys"])
def test_edge_shapes(shape):
    """One query over many keys (integer arguments folded to 1); causal rows that see no key
    (output 0, lse -inf)."""
    check(shape, 128, torch.bfloat16, True)


# The dense head-dim-64 rows config_for picks by the number of queries: the long one
# (LONG_QUERIES or more; 192-query tiles on three consumers, the last tile here 68 rows,
# 21 * 192 + 68 = 4100) and the short one (Sq != Sk, bottom-right causal, odd lengths).
DENSE_ROWS = {"long": ((1, 4100, 4100, 4, 2), sm90.LONG_QUERY_CONFIGS[64], "all"),
              "short": ((2, 1000, 1300, 4, 2), sm90.SHORT_QUERY_CONFIGS[64], "causal")}


@pytest.mark.parametrize("causal", [False, True], ids=["non-causal", "causal"])
@pytest.mark.parametrize("row", list(DENSE_ROWS))
def test_dense_call_rows(row, causal):
    """Each dense head-dim-64 row, with and without an lse, against fp64. How P's rows are
    summed differs by row and call: the long row's causal calls without an lse on the tensor
    cores (causal_row_sums), its other calls, and the short row's causal ones, as per-thread
    partial sums (partial_row_sums)."""
    shape, row_config, partial = DENSE_ROWS[row]
    q, k, v = make_inputs(shape, 64, torch.bfloat16)
    config = sm90.config_for(64, 64, seqlen_q=shape[1])
    assert config is row_config and config.partial_row_sums == partial
    assert config.block_m == (192 if row == "long" else 128)
    assert config.causal_row_sums == (row == "long")
    out, lse = run_sm90(q, k, v, causal, config=config)
    assert_close(out, lse, q, k, v, causal)
    out_only, _ = run_sm90(q, k, v, causal, config=config, with_lse=False)
    ref, _ = attention_reference(q, k, v, causal=causal)
    assert not out_only.isnan().any()
    assert float((out_only.double() - ref).norm() / ref.norm()) < TOLERANCES[q.dtype]


def test_strided_views_of_a_fused_qkv_buffer():
    qkv = torch.randn(2, 1000, 3, 8, 128, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.unbind(2)
    out, lse = run_sm90(q, k, v, True)
    assert_close(out, lse, q, k, v, True)


@pytest.mark.parametrize("case", ["gqa-unequal", "gqa-unequal-causal", "d256-fp16", "fused-qkv"])
def test_attention_dispatches_here(case, monkeypatch):
    """attention() itself (no forced kernel) runs this kernel where it measured faster; the
    work threshold is lowered so that test-sized inputs qualify (tests/test_dispatch.py checks
    the threshold)."""
    from tileattn.arch import arch_of
    monkeypatch.setattr(dispatch, "SM90_MIN_WORK", 0)
    attention_op._CALLS.clear()  # a cached call of the same signature would keep its earlier choice
    causal = case.endswith("-causal")
    if case == "fused-qkv":
        q, k, v = torch.randn(1, 3000, 3, 8, 128, device="cuda", dtype=torch.bfloat16).unbind(2)
    elif case == "d256-fp16":
        q, k, v = make_inputs(SHAPE, 256, torch.float16)
    else:
        q, k, v = make_inputs((2, 1000, 4099, 8, 2), 128, torch.bfloat16)
    settings = dispatch.current()
    assert dispatch.attention_kernel(arch_of(q.device), q, k, v, causal, settings) == "sm90"
    out, lse = tileattn.attention(q, k, v, causal=causal, return_lse=True)
    assert_close(out, lse, q, k, v, causal)


@pytest.mark.parametrize("causal", [False, True])
def test_repeat_calls_replay_here(causal, monkeypatch):
    """attention()'s call cache replays this kernel for a repeated signature (no checks, no
    Triton binder): each call must still read its own tensors and scale."""
    monkeypatch.setattr(dispatch, "SM90_MIN_WORK", 0)
    attention_op._CALLS.clear()
    for seed, scale in ((0, None), (1, None), (2, 0.05), (3, 0.1)):
        gen = torch.Generator(device="cuda").manual_seed(100 + seed)
        q, k, v = (torch.randn(2, length, heads, 128, device="cuda", generator=gen)
                   .to(torch.bfloat16) for length, heads in ((1000, 8), (1000, 2), (1000, 2)))
        out, lse = tileattn.attention(q, k, v, causal=causal, softmax_scale=scale, return_lse=True)
        ref, ref_lse = attention_reference(q, k, v, causal=causal, softmax_scale=scale)
        assert float((out.double() - ref).norm() / ref.norm()) < TOLERANCES[torch.bfloat16]
        assert ((lse.double() - ref_lse).abs() / ref_lse.abs().clamp(min=1)).max() \
            < LSE_TOLERANCES[torch.bfloat16]
    assert len(attention_op._CALLS._entries) == 2  # default and explicit scale: two signatures


@pytest.mark.parametrize("dtype, head_dim, causal, split, cap, q_scale", [
    (torch.bfloat16, 128, True, None, 2.0, 4), (torch.float16, 256, False, None, 2.0, 4),
    (torch.bfloat16, 128, False, False, 2.0, 4), (torch.bfloat16, 192, True, None, 2.0, 4),
    (torch.bfloat16, 128, True, None, 10.0, 2), (torch.float16, 64, False, None, 10.0, 2),
], ids=lambda p: str(p).replace("torch.", ""))
def test_softcap(dtype, head_dim, causal, split, cap, q_scale):
    """softcap > 0 (Gemma-2's logit cap) in this kernel: scores s -> cap * tanh(s / cap) before
    masking, against the fp64 reference, with a cap small enough to bend most scores: cap 2
    on scores of several units (most beyond the cap), cap 10 on scores mostly within it."""
    q, k, v = make_inputs(SHAPE, head_dim, dtype)
    q = q * q_scale                                     # scores of several units: tanh bends them
    out, lse = run_sm90(q, k, v, causal, split, softcap=cap)
    plain, _ = attention_reference(q, k, v, causal=causal)
    ref, _ = attention_reference(q, k, v, causal=causal, softcap=cap)
    assert float((plain - ref).norm() / ref.norm()) > 10 * TOLERANCES[dtype]   # the cap matters
    assert_close(out, lse, q, k, v, causal, softcap=cap)
    # Without an lse, P's row sums run on the tensor cores at D=128 (sm90.SOFTCAP_ROW_SUM_DIMS).
    out_only, _ = run_sm90(q, k, v, causal, split, with_lse=False, softcap=cap)
    assert not out_only.isnan().any()
    assert float((out_only.double() - ref).norm() / ref.norm()) < TOLERANCES[dtype]


@pytest.mark.parametrize("dtype, head_dim, causal, left, shape, split", [
    (torch.bfloat16, 128, True, 1023, SHAPE, None), (torch.bfloat16, 128, True, 0, SHAPE, None),
    (torch.float16, 256, False, 300, SHAPE, None), (torch.bfloat16, 128, True, 100, SHAPE, False),
    (torch.bfloat16, 128, True, 64, (1, 3000, 17, 4, 2), None),
    (torch.bfloat16, 192, True, 77, (2, 1000, 1024, 8, 2), None),
    (torch.bfloat16, 64, False, 5000, (1, 17, 3000, 4, 2), None),
], ids=lambda p: str(p).replace("torch.", ""))
def test_left_window(dtype, head_dim, causal, left, shape, split):
    """window_size=(left, 0 with causal, else -1): tiles visit only their window's key blocks
    (a left-masked loop, the full blocks, the right-masked loop); windows of 0, of less than
    a block, wider than the keys, more queries than keys (rows that see nothing), padded D."""
    q, k, v = make_inputs(shape, head_dim, dtype)
    out, lse = run_sm90(q, k, v, causal, split, window_left=left)
    assert_close(out, lse, q, k, v, causal, window_size=(left, 0 if causal else -1))


def test_window_dispatches_and_replays_here(monkeypatch):
    """attention(window_size=(w, 0), causal=True) runs this kernel (softcap too) and its
    cached replay keeps the window; a window with a right bound and no causal mask does not."""
    monkeypatch.setattr(dispatch, "SM90_MIN_WORK", 0)
    attention_op._CALLS.clear()
    launched = record_launches(monkeypatch, "window_left")
    for seed in range(3):
        q, k, v = make_inputs((2, 1000, 1000, 8, 2), 128, torch.bfloat16)
        q = q * (1 + seed)
        out = tileattn.attention(q, k, v, causal=True, window_size=(200, 0), softcap=5.0)
        ref, _ = attention_reference(q, k, v, causal=True, window_size=(200, 0), softcap=5.0)
        assert float((out.double() - ref).norm() / ref.norm()) < TOLERANCES[torch.bfloat16]
    assert launched == [200]                            # built once, then replayed
    assert len(attention_op._CALLS._entries) == 1
    tileattn.attention(q, k, v, window_size=(200, 30))
    assert launched == [200]                            # the portable kernel ran


def test_softcap_dispatches_replays_and_differentiates_here(monkeypatch):
    """attention(softcap=...) runs this kernel, its cached replay takes each call's cap, and
    the backward (the portable kernels, the same tanh) matches fp64 autograd."""
    from tileattn.arch import arch_of
    monkeypatch.setattr(dispatch, "SM90_MIN_WORK", 0)
    attention_op._CALLS.clear()
    launched = record_launches(monkeypatch, "softcap")
    for seed, cap in ((0, 3.0), (1, 1.5), (2, 30.0)):     # one signature: the last two replay
        q, k, v = make_inputs((2, 1000, 1000, 8, 2), 128, torch.bfloat16)
        q = q * (4 + seed)
        assert dispatch.attention_kernel(arch_of(q.device), q, k, v, True,
                                         dispatch.current()) == "sm90"
        out, lse = tileattn.attention(q, k, v, causal=True, softcap=cap, return_lse=True)
        ref, ref_lse = attention_reference(q, k, v, causal=True, softcap=cap)
        assert float((out.double() - ref).norm() / ref.norm()) < TOLERANCES[torch.bfloat16]
    assert launched == [3.0]        # built once; the replays took 1.5 and 30 (references)
    assert len(attention_op._CALLS._entries) == 1
    assert_gradients_close(4.0, causal=True, softcap=2.0)


@pytest.mark.parametrize("causal, softcap", [(True, 0.0), (False, 0.0), (True, 10.0)])
def test_alibi_dispatches_replays_and_differentiates_here(causal, softcap, monkeypatch):
    """attention(alibi_slopes=...) runs this kernel (the built-in ALiBi score hook, after a
    softcap), its replay takes each call's slopes, and the backward matches fp64 autograd."""
    monkeypatch.setattr(dispatch, "SM90_MIN_WORK", 0)
    attention_op._CALLS.clear()
    launched = record_launches(monkeypatch, "score_mod")
    for seed in range(2):                               # the second call replays
        q, k, v = make_inputs((2, 1000, 1300, 8, 2), 128, torch.bfloat16)
        slopes = torch.rand(2, 8, device="cuda") * (seed + 1)
        out, lse = tileattn.attention(q, k, v, causal=causal, softcap=softcap,
                                      alibi_slopes=slopes, return_lse=True)
        assert_close(out, lse, q, k, v, causal, softcap=softcap, alibi_slopes=slopes)
    assert len(launched) == 1 and launched[0] is not None    # the second call replayed
    assert len(attention_op._CALLS._entries) == 1
    assert_gradients_close(1.0, causal=causal, softcap=softcap,
                           alibi_slopes=torch.rand(8, device="cuda"))


# ---- full grid (pytest --full) -----------------------------------------------------------------

@pytest.mark.full
@pytest.mark.parametrize("split", [False, True], ids=["lockstep", "pingpong"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=lambda d: f"D{d}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_full_grid(dtype, head_dim, shape, causal, split):
    check(shape, head_dim, dtype, causal, split=split)


@pytest.mark.full
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 1000, 1024, 8, 2), (1, 33, 4096, 4, 1), (2, 17, 17, 4, 2),
                                   (1, 3000, 64, 4, 4)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dims", PADDED_DIMS, ids=lambda d: f"D{d[0]}-Dv{d[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_full_padded_and_unequal_head_dims(dtype, dims, shape, causal):
    """96/192 run on tiles padded to 128/256 (TMA zero-fills Q/K/V past the head dim, the
    store masks the output's padding); Dv != D (e.g. 192/128, DeepSeek's prefill)."""
    check(shape, dims[0], dtype, causal, head_dim_v=dims[1])
