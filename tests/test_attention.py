"""attention() against the fp64 reference: on CPU the real Triton kernel runs in the interpreter."""

import math

import pytest
import torch

import tileattn
from tileattn import arch as arch_module
from tileattn.kernels.attention import fwd as attention_fwd
from tileattn.kernels.runtime import interpreter_active
from tileattn.reference import attention_reference

from .conftest import LSE_TOLERANCES, TOLERANCES

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# bf16 runs on the CPU thanks to tileattn/interpreter_fixes.py (Triton 3.6's interpreter
# multiplies bf16 storage as integers).
CPU_DTYPES = [torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2]

# (batch, seqlen_q, seqlen_k, num_q_heads, num_kv_heads, head_dim, head_dim_v, causal)
SHAPES = [
    (1, 1, 1, 2, 2, 64, 64, False),        # single token
    (2, 17, 17, 4, 2, 64, 64, True),       # GQA, odd length
    (1, 100, 100, 4, 1, 64, 64, True),     # MQA
    (1, 257, 257, 1, 1, 64, 64, False),    # many tiles plus a one-row tail
    (1, 37, 100, 2, 2, 128, 128, True),    # Sq < Sk: bottom-right causal
    (1, 100, 37, 2, 2, 64, 64, True),      # Sq > Sk: first rows see no key at all
    (1, 33, 65, 2, 2, 192, 128, False),    # DeepSeek prefill D=192, Dv=128
    (1, 20, 20, 2, 2, 96, 96, True),
    (1, 16, 40, 2, 1, 256, 256, False),
    (3, 70, 70, 5, 5, 64, 64, True),       # 15 (batch, head) pairs: a partial causal LPT group
]


def make_inputs(shape, dtype, per="tensor", seed=0):
    """Fresh random normal inputs; FP8 ones quantized with their descales."""
    batch, seqlen_q, seqlen_k, num_q_heads, num_kv_heads, head_dim, head_dim_v, _ = shape
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seqlen_q, num_q_heads, head_dim, generator=gen)
    k = torch.randn(batch, seqlen_k, num_kv_heads, head_dim, generator=gen)
    v = torch.randn(batch, seqlen_k, num_kv_heads, head_dim_v, generator=gen)
    q, k, v = (x.to(DEVICE) for x in (q, k, v))
    if dtype in arch_module.FP8_DTYPES:
        (q, qd), (k, kd), (v, vd) = (tileattn.quantize_fp8(x, dtype, per=per) for x in (q, k, v))
        return q, k, v, dict(q_descale=qd, k_descale=kd, v_descale=vd)
    return q.to(dtype), k.to(dtype), v.to(dtype), {}


def relative_error(out, ref):
    return float((out.double() - ref).norm() / ref.norm())


def assert_close_to_reference(out, lse, q, k, v, causal, descales, softmax_scale=None):
    ref_out, ref_lse = attention_reference(q, k, v, causal=causal, softmax_scale=softmax_scale,
                                           **descales)
    assert torch.isfinite(out).all(), "output has NaN/inf"
    assert relative_error(out, ref_out) < TOLERANCES[q.dtype]
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse)), "rows with no visible key differ"
    finite = torch.isfinite(ref_lse)
    lse_error = (lse.double() - ref_lse)[finite].abs() / ref_lse[finite].abs().clamp(min=1)
    assert lse_error.max() < LSE_TOLERANCES[q.dtype]


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_reference(shape, dtype):
    q, k, v, descales = make_inputs(shape, dtype)
    causal = shape[-1]
    out, lse = tileattn.attention(q, k, v, causal=causal, return_lse=True, **descales)
    expected_dtype = torch.bfloat16 if dtype in arch_module.FP8_DTYPES else dtype
    assert out.dtype == expected_dtype and out.shape == (*q.shape[:3], v.shape[3])
    assert lse.dtype == torch.float32 and lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    assert_close_to_reference(out, lse, q, k, v, causal, descales)


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_scores_growing_along_the_keys(dtype, causal):
    """Row maxima that climb block after block, so that the running max, the accumulator's
    rescaling and each row's dominant weight change along the whole sequence."""
    gen = torch.Generator().manual_seed(3)
    seqlen, head_dim = 150, 64
    ramp = 0.02 * torch.arange(seqlen, dtype=torch.float32)            # key norm grows with j
    q = 1.0 + 0.3 * torch.randn(1, seqlen, 2, head_dim, generator=gen)
    k = ramp[None, :, None, None] * (1.0 + 0.3 * torch.randn(1, seqlen, 2, head_dim, generator=gen))
    v = torch.randn(1, seqlen, 2, head_dim, generator=gen)
    q, k, v = (x.to(DEVICE) for x in (q, k, v))
    if dtype in arch_module.FP8_DTYPES:
        (q, qd), (k, kd), (v, vd) = (tileattn.quantize_fp8(x, dtype) for x in (q, k, v))
        descales = dict(q_descale=qd, k_descale=kd, v_descale=vd)
    else:
        q, k, v, descales = q.to(dtype), k.to(dtype), v.to(dtype), {}
    out, lse = tileattn.attention(q, k, v, causal=causal, return_lse=True, **descales)
    assert_close_to_reference(out, lse, q, k, v, causal, descales)


def test_fully_masked_rows_are_zero():
    q, k, v, _ = make_inputs((1, 50, 10, 2, 2, 64, 64, True), torch.float16)
    out, lse = tileattn.attention(q, k, v, causal=True, return_lse=True)
    # Query i sees keys j <= i - 40: the first 40 rows see nothing.
    assert torch.all(out[:, :40] == 0) and torch.all(lse[:, :, :40] == float("-inf"))
    assert torch.all(out[:, 40:].abs().sum(-1) > 0)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_per_head_descales(dtype):
    shape = (2, 33, 47, 4, 2, 64, 64, True)
    q, k, v, descales = make_inputs(shape, dtype, per="head")
    assert descales["q_descale"].shape == (2, 4) and descales["k_descale"].shape == (2, 2)
    out, lse = tileattn.attention(q, k, v, causal=True, return_lse=True, **descales)
    assert_close_to_reference(out, lse, q, k, v, True, descales)


def test_fp8_missing_descales_mean_one():
    q, k, v, _ = make_inputs((1, 20, 20, 2, 2, 64, 64, False), torch.float16)
    q, k, v = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
    out, lse = tileattn.attention(q, k, v, return_lse=True)
    assert_close_to_reference(out, lse, q, k, v, False, {})


def test_strided_qkv_from_fused_buffer():
    batch, seqlen, heads, head_dim = 2, 45, 2, 64
    qkv = torch.randn(batch, seqlen, 3, heads, head_dim, device=DEVICE).to(torch.float16)
    q, k, v = qkv.unbind(dim=2)
    assert not q.is_contiguous()
    out, lse = tileattn.attention(q, k, v, causal=True, return_lse=True)
    assert_close_to_reference(out, lse, q, k, v, True, {})


@pytest.mark.parametrize("dtype", [torch.float16, torch.float8_e4m3fn], ids=str)
def test_pre_transposed_v_gives_same_result(dtype):
    q, k, v, descales = make_inputs((1, 40, 70, 2, 2, 64, 64, False), dtype)
    v_k_major = tileattn.prepare_v(v)
    assert v_k_major.shape == v.shape and v_k_major.stride(1) == 1
    assert tileattn.prepare_v(v_k_major) is v_k_major, "a K-major V must not be copied again"
    out_row_major = tileattn.attention(q, k, v, **descales)
    out_k_major = tileattn.attention(q, k, v_k_major, **descales)
    torch.testing.assert_close(out_row_major, out_k_major, atol=0, rtol=0)


def test_softmax_scale_and_out_dtype():
    shape = (1, 30, 30, 2, 2, 64, 64, False)
    q, k, v, _ = make_inputs(shape, torch.float16)
    out, lse = tileattn.attention(q, k, v, softmax_scale=0.3, out_dtype=torch.float32,
                                  return_lse=True)
    assert out.dtype == torch.float32
    assert_close_to_reference(out, lse, q, k, v, False, {}, softmax_scale=0.3)


def test_every_output_element_is_written():
    """Poison out and lse, run the launcher directly, and check nothing is left unwritten."""
    shape = (3, 45, 29, 5, 1, 96, 64, True)   # 15 (batch, head) pairs: groups of 8 and 7
    q, k, v, _ = make_inputs(shape, torch.float16)
    out = torch.full((3, 45, 5, 64), float("nan"), dtype=torch.float16, device=DEVICE)
    lse = torch.full((3, 5, 45), float("nan"), device=DEVICE)
    attention_fwd.attention_launch(q, k, v, out, lse, None, None, None, 1 / math.sqrt(96), True,
                                   arch_module.arch_of(q.device)).run()
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert_close_to_reference(out, lse, q, k, v, True, {})


@pytest.mark.skipif(DEVICE != "cpu", reason="runs an sm90 arch row's layout on the CPU's tiles")
def test_fp8_v_is_made_k_major_where_the_arch_needs_it(monkeypatch):
    """With an sm90 arch row, FP8 V reaches the kernel K-major; fp16 V is left alone."""
    seen = {}
    real_launch = attention_fwd.attention_launch

    def spy(q, k, v, *args, **kwargs):
        seen["v_stride_seq"] = v.stride(1)
        return real_launch(q, k, v, *args[:-1], arch_module.CPU, **kwargs)

    monkeypatch.setattr("tileattn.ops.attention.arch_of", lambda device: arch_module.arch_for_capability((9, 0)))
    monkeypatch.setattr(attention_fwd, "attention_launch", spy)
    for dtype, k_major in ((torch.float8_e4m3fn, True), (torch.float16, False)):
        q, k, v, descales = make_inputs((1, 20, 20, 2, 2, 64, 64, False), dtype)
        if not interpreter_active() and DEVICE == "cpu":
            pytest.skip("CPU without the interpreter runs the reference, not the kernel")
        tileattn.attention(q, k, v, **descales)
        assert (seen["v_stride_seq"] == 1) == k_major
