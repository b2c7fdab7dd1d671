"""The Hopper Gluon kernel (tileattn.kernels.attention_sm90) against the fp64 reference, on an
sm90 GPU: every dtype, head dim, causal or not, GQA, odd and unequal lengths. Skipped elsewhere."""

import dataclasses

import pytest
import torch

import tileattn
from tileattn.arch import FP8_DTYPES
from tileattn import fp8
from tileattn.fp8 import prepare_v
from tileattn import dispatch
from tileattn.kernels.attention import sm90
from tileattn.ops import attention as attention_op
from tileattn.reference import attention_reference

from ..conftest import LSE_TOLERANCES, TOLERANCES

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm90 GPU")

DTYPES = [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2]
HEAD_DIMS = [64, 128, 256]
# (batch, seqlen_q, seqlen_k, num_q_heads, num_kv_heads)
SHAPES = [(1, 1, 1, 2, 1), (2, 17, 17, 4, 2), (2, 1000, 1000, 8, 2), (1, 4097, 4097, 2, 2),
          (3, 1, 4097, 8, 1), (1, 17, 3000, 4, 2), (1, 3000, 17, 4, 2),
          # seqlen_k a multiple of 16, so that FP8's K-major V is TMA-addressable:
          (2, 1000, 1024, 8, 2), (1, 33, 4096, 4, 1), (1, 3000, 64, 4, 4)]


def run_sm90(q, k, v, causal, descales, split=None, grouped=False):
    """out, lse from the sm90 kernel, or None where supports() declines the inputs.
    grouped: V copied K-major in grouped key order (kernels/layout.py)."""
    if grouped:
        v = fp8.k_major_copy(v, group_keys=True)
    elif q.dtype in FP8_DTYPES:
        v = prepare_v(v)
    if not attention_sm90_policy.supports(q, k, v, causal):
        return None
    batch, seqlen_q, num_q_heads, _ = q.shape
    out = torch.empty(batch, seqlen_q, num_q_heads, v.shape[3], device=q.device,
                      dtype=torch.bfloat16 if q.dtype in FP8_DTYPES else q.dtype)
    lse = torch.empty(batch, num_q_heads, seqlen_q, device=q.device)
    config = sm90.config_for(q.shape[3], v.shape[3], q.dtype in FP8_DTYPES)
    if split is not None:
        config = dataclasses.replace(config, split=split)
    sm90.attention_sm90_launch(q, k, v, out, lse, descales.get("q_descale"),
                               descales.get("k_descale"), descales.get("v_descale"),
                               q.shape[3] ** -0.5, causal, config=config,
                               v_keys_grouped=grouped).run()
    return out, lse


def make_inputs(shape, head_dim, dtype, per="tensor", head_dim_v=None):
    batch, seqlen_q, seqlen_k, num_q_heads, num_kv_heads = shape
    gen = torch.Generator(device="cuda").manual_seed(sum(shape) + head_dim)
    q = torch.randn(batch, seqlen_q, num_q_heads, head_dim, device="cuda", generator=gen)
    k = torch.randn(batch, seqlen_k, num_kv_heads, head_dim, device="cuda", generator=gen)
    v = torch.randn(batch, seqlen_k, num_kv_heads, head_dim_v or head_dim, device="cuda",
                    generator=gen)
    if dtype in FP8_DTYPES:
        (q, qd), (k, kd), (v, vd) = (tileattn.quantize_fp8(x, dtype, per=per) for x in (q, k, v))
        return q, k, v, dict(q_descale=qd, k_descale=kd, v_descale=vd)
    return q.to(dtype), k.to(dtype), v.to(dtype), {}


def check(shape, head_dim, dtype, causal, per="tensor", split=None, grouped=False,
          head_dim_v=None):
    q, k, v, descales = make_inputs(shape, head_dim, dtype, per, head_dim_v)
    result = run_sm90(q, k, v, causal, descales, split, grouped)
    if result is None:
        assert not grouped, "a grouped-order V (padded to 32 keys) is always TMA-addressable"
        assert dtype in FP8_DTYPES and shape[2] % 16 != 0, "supports() declined a TMA-able case"
        pytest.skip("FP8 K-major V needs seqlen_k % 16 == 0 for TMA; portable kernel runs it")
    out, lse = result
    ref, ref_lse = attention_reference(q, k, v, causal=causal, **descales)
    assert torch.isfinite(out).all()
    error = float((out.double() - ref).norm() / ref.norm().clamp(min=1e-30))
    if ref.norm() == 0:
        assert out.abs().max() == 0
    else:
        assert error < TOLERANCES[dtype], error
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    assert ((lse.double() - ref_lse)[finite].abs() / ref_lse[finite].abs().clamp(min=1)).max() \
        < LSE_TOLERANCES[dtype]


# Both consumer structures: one 8-warp partition (lockstep) and two 4-warp partitions taking
# turns at the tensor cores (pingpong).
SPLITS = pytest.mark.parametrize("split", [False, True], ids=["lockstep", "pingpong"])


@SPLITS
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=lambda d: f"D{d}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_against_reference(dtype, head_dim, shape, causal, split):
    check(shape, head_dim, dtype, causal, split=split)


@SPLITS
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=lambda d: f"D{d}")
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_grouped_v_keys(dtype, head_dim, shape, causal, split):
    """FP8 V in grouped key order (experimental, TILEATTN_FP8_V_KEYS=grouped): P reordered to
    match. Any seqlen_k, since the copy is padded to 32 keys."""
    check(shape, head_dim, dtype, causal, split=split, grouped=True)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 1000, 1024, 8, 2), (1, 33, 4096, 4, 1), (2, 17, 17, 4, 2),
                                   (1, 3000, 64, 4, 4)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dims", [(192, 128), (96, 96), (192, 192), (128, 64), (64, 256)],
                         ids=lambda d: f"D{d[0]}-Dv{d[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_padded_and_unequal_head_dims(dtype, dims, shape, causal):
    """96/192 run on tiles padded to 128/256 (TMA zero-fills Q/K/V past the head dim, the
    store masks the output's padding); Dv != D (e.g. 192/128, DeepSeek's prefill)."""
    check(shape, dims[0], dtype, causal, head_dim_v=dims[1])


@SPLITS
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_per_head_descales(dtype, split):
    check((2, 2000, 2048, 8, 4), 128, dtype, True, per="head", split=split)


def test_strided_views_of_a_fused_qkv_buffer():
    qkv = torch.randn(2, 1000, 3, 8, 128, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.unbind(2)
    out, lse = run_sm90(q, k, v, True, {})
    ref, _ = attention_reference(q, k, v, causal=True)
    assert float((out.double() - ref).norm() / ref.norm()) < TOLERANCES[torch.bfloat16]


@pytest.mark.parametrize("case", ["gqa-unequal", "gqa-unequal-causal", "d256-fp16", "fused-qkv"])
def test_attention_dispatches_here(case, monkeypatch):
    """attention() itself (no TILEATTN_KERNEL) runs this kernel where it measured faster; the
    work threshold is lowered so that test-sized inputs qualify (tests/test_dispatch.py checks
    the threshold)."""
    from tileattn.arch import arch_of
    monkeypatch.setattr(dispatch, "SM90_MIN_WORK", 0)
    attention_op._CALLS.clear()  # a cached call of the same signature would keep its earlier choice
    causal = case.endswith("-causal")
    if case == "fused-qkv":
        q, k, v = torch.randn(1, 4096, 3, 8, 128, device="cuda", dtype=torch.bfloat16).unbind(2)
    else:
        shape = (2, 1000, 4099, 8, 2) if case.startswith("gqa-unequal") else (1, 4097, 4097, 4, 4)
        dtype = torch.float16 if case == "d256-fp16" else torch.bfloat16
        q, k, v, _ = make_inputs(shape, 256 if case == "d256-fp16" else 128, dtype)
    assert dispatch.attention_kernel(arch_of(q.device), q, k, v, causal, dispatch.current()) == "sm90"
    out, lse = tileattn.attention(q, k, v, causal=causal, return_lse=True)
    ref, ref_lse = attention_reference(q, k, v, causal=causal)
    assert float((out.double() - ref).norm() / ref.norm()) < TOLERANCES[q.dtype]
    assert ((lse.double() - ref_lse).abs() / ref_lse.abs().clamp(min=1)).max() < LSE_TOLERANCES[q.dtype]


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
    assert len(api._CALLS) == 2  # default and explicit scale: two signatures, two replays
