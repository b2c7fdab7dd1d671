"""Every bad input to attention() gets a ValueError/TypeError that names the argument."""

import subprocess
import sys

import numpy as np
import pytest
import torch

import tileattn

E4M3 = torch.float8_e4m3fn


def inputs(batch=1, seqlen_q=8, seqlen_k=8, num_q_heads=4, num_kv_heads=2, head_dim=64,
           head_dim_v=64, dtype=torch.float16):
    q = torch.randn(batch, seqlen_q, num_q_heads, head_dim).to(dtype)
    k = torch.randn(batch, seqlen_k, num_kv_heads, head_dim).to(dtype)
    v = torch.randn(batch, seqlen_k, num_kv_heads, head_dim_v).to(dtype)
    return q, k, v


def fp8_inputs():
    return inputs(dtype=E4M3)


CASES = {
    "q not a tensor": (lambda: ([1.0], *inputs()[1:]), {}, TypeError, "q must be a torch.Tensor"),
    "k wrong rank": (lambda: (inputs()[0], inputs()[1][0], inputs()[2]), {}, ValueError, "k must have 4 dimensions"),
    "float32 input": (lambda: inputs(dtype=torch.float32), {}, TypeError, "q must be float16"),
    "mixed dtypes": (lambda: (inputs()[0], inputs()[1].bfloat16(), inputs()[2]), {}, TypeError, "share one dtype"),
    "batch mismatch": (lambda: (inputs(batch=2)[0], *inputs()[1:]), {}, ValueError, "batch sizes differ"),
    "k/v seqlen mismatch": (lambda: (*inputs()[:2], inputs(seqlen_k=9)[2]), {}, ValueError, "v must have k's seqlen"),
    "k/v heads mismatch": (lambda: (*inputs()[:2], inputs(num_kv_heads=1)[2]), {}, ValueError, "v must have k's number of heads"),
    "heads not a multiple": (lambda: inputs(num_q_heads=3), {}, ValueError, "multiple of k's heads"),
    "q/k head_dim mismatch": (lambda: (inputs(head_dim=128)[0], *inputs()[1:]), {}, ValueError, "k must have q's head_dim"),
    "unsupported head_dim": (lambda: inputs(head_dim=80, head_dim_v=64), {}, ValueError, "q/k head_dim must be one of"),
    "unsupported v head_dim": (lambda: inputs(head_dim_v=48), {}, ValueError, "v head_dim must be one of"),
    "q last dim strided": (lambda: (torch.randn(1, 8, 4, 128).half()[..., ::2], *inputs()[1:]), {}, ValueError, "q must have a contiguous last dim"),
    "v neither layout": (lambda: (*inputs()[:2], torch.randn(1, 8, 2, 128).half()[..., ::2]), {}, ValueError, "v must have a contiguous last dim or a contiguous seqlen dim"),
    "descale on fp16": (lambda: inputs(), {"q_descale": torch.ones(())}, ValueError, "apply only to FP8"),
    "descale wrong dtype": (fp8_inputs, {"k_descale": torch.ones((), dtype=torch.float64)}, TypeError, "k_descale must be float32"),
    "descale wrong shape": (fp8_inputs, {"v_descale": torch.ones(1, 4)}, ValueError, "v_descale must have shape [] (per tensor) or [1, 2] (per batch and head)"),
    "q descale uses kv heads": (fp8_inputs, {"q_descale": torch.ones(1, 2)}, ValueError, "q_descale must have shape [] (per tensor), [1, 4] (per batch and head) or [1, 4, 1] (per 128-row block)"),
    "block descale wrong count": (fp8_inputs, {"k_descale": torch.ones(1, 2, 2)}, ValueError, "k_descale must have shape [] (per tensor), [1, 2] (per batch and head) or [1, 2, 1]"),
    "block descale on v": (fp8_inputs, {"v_descale": torch.ones(1, 2, 1)}, ValueError, "v_descale must have shape [] (per tensor) or [1, 2] (per batch and head)"),
    "descale not a tensor": (fp8_inputs, {"q_descale": 1.0}, TypeError, "q_descale must be a float32 torch.Tensor"),
    "causal not bool": (lambda: inputs(), {"causal": 1}, TypeError, "causal must be a bool"),
    "negative softmax_scale": (lambda: inputs(), {"softmax_scale": -1.0}, ValueError, "softmax_scale must be"),
    "nan softmax_scale": (lambda: inputs(), {"softmax_scale": float("nan")}, ValueError, "softmax_scale must be"),
    "bool softmax_scale": (lambda: inputs(), {"softmax_scale": True}, TypeError, "softmax_scale must be a real number, got the bool"),
    "numpy bool softmax_scale": (lambda: inputs(), {"softmax_scale": np.bool_(True)}, TypeError, "softmax_scale must be a real number, got the bool"),
    "tensor softmax_scale": (lambda: inputs(), {"softmax_scale": torch.ones(2)}, TypeError, "softmax_scale must be a real number or a 0-d"),
    "return_lse not bool": (lambda: inputs(), {"return_lse": 1}, TypeError, "return_lse must be a bool"),
    "zero kv heads": (lambda: inputs(num_kv_heads=0), {}, ValueError, "non-zero multiple"),
    "bad out_dtype": (lambda: inputs(), {"out_dtype": torch.int8}, TypeError, "out_dtype must be"),
    # No backward pass for FP8 or for descales: such an input would get no gradient.
    "fp8 k requires grad": (lambda: (fp8_inputs()[0], fp8_inputs()[1].float().requires_grad_().to(E4M3),
                                     fp8_inputs()[2]), {},
                            TypeError, "k requires grad, but tileattn.attention has no backward"),
    "descale requires grad": (fp8_inputs, {"v_descale": torch.ones((), requires_grad=True)},
                              ValueError, "v_descale requires grad"),
}


def test_inputs_requiring_grad_run_when_autograd_is_off():
    q, k, v = inputs()
    q.requires_grad_()
    with torch.no_grad():
        assert tileattn.attention(q, k, v).shape == q.shape
    with torch.inference_mode():
        assert tileattn.attention(q.detach(), k, v).shape == q.shape


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_bad_input_is_named(case):
    make, kwargs, error, message = CASES[case]
    with pytest.raises(error) as info:
        tileattn.attention(*make(), **kwargs)
    assert message in str(info.value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device")
def test_tensors_on_different_devices():
    q, k, v = inputs()
    with pytest.raises(ValueError, match="k is on cuda"):
        tileattn.attention(q, k.cuda(), v)


def test_descale_on_other_device_is_named(monkeypatch):
    q, k, v = fp8_inputs()
    descale = torch.ones((), device="meta")
    with pytest.raises(ValueError, match="q_descale is on meta"):
        tileattn.attention(q, k, v, q_descale=descale)


@pytest.mark.parametrize("kwargs,error,message", [
    ({"dtype": torch.float16}, TypeError, "dtype must be"),
    ({"per": "row"}, ValueError, "per must be"),
])
def test_quantize_fp8_rejects(kwargs, error, message):
    with pytest.raises(error, match=message):
        tileattn.quantize_fp8(torch.randn(1, 4, 2, 64), **kwargs)


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_quantize_fp8_refuses_non_finite_inputs(bad):
    x = torch.randn(1, 4, 2, 64)
    x[0, 1, 1, 3] = bad
    with pytest.raises(ValueError, match="x holds non-finite values"):
        tileattn.quantize_fp8(x)


@pytest.mark.parametrize("scale", [np.float32(0.125), np.float64(0.125), torch.tensor(0.125), 0.125,
                                   np.int64(1)], ids=["np32", "np64", "0d-tensor", "float", "np-int"])
def test_softmax_scale_accepts_numpy_and_0d_tensor_scalars(scale):
    q, k, v = inputs()
    out = tileattn.attention(q, k, v, softmax_scale=scale)
    expected = tileattn.attention(q, k, v, softmax_scale=float(scale))
    assert torch.equal(out, expected)


@pytest.mark.parametrize("dtype", [torch.float16, E4M3])
@pytest.mark.parametrize("shape", [(0, 8, 8), (2, 0, 8), (2, 8, 0), (2, 0, 0)],
                         ids=["no-batch", "no-queries", "no-keys", "neither"])
def test_empty_inputs_follow_sdpa(shape, dtype):
    """No batch or no queries: empty outputs; no keys: zeros and lse -inf (as a row that sees
    no key under a causal mask)."""
    batch, seqlen_q, seqlen_k = shape
    q, k, v = inputs(batch, seqlen_q, seqlen_k, head_dim_v=128, dtype=dtype)
    for causal in (False, True):
        out, lse = tileattn.attention(q, k, v, causal=causal, return_lse=True)
        assert out.shape == (batch, seqlen_q, 4, 128) and lse.shape == (batch, 4, seqlen_q)
        assert out.dtype == (torch.bfloat16 if dtype == E4M3 else dtype)
        assert torch.all(out == 0) and torch.all(lse == float("-inf"))


def test_meta_tensors_get_meta_outputs_through_the_shape_function():
    q, k, v = (x.to("meta") for x in inputs(head_dim_v=128))
    out, lse = tileattn.attention(q, k, v, return_lse=True)
    assert out.device.type == "meta" and out.shape == (1, 8, 4, 128) and lse.shape == (1, 4, 8)
    with pytest.raises(ValueError, match="k must have q's head_dim"):
        tileattn.attention(q, k[..., :32], v)


def test_cpu_tensors_without_the_interpreter_are_refused():
    """Without TRITON_INTERPRET=1 (set before import) the kernels cannot run on the CPU; an
    fp64 reference result would pass for the kernel's, so the call is refused instead."""
    import os
    code = ("import torch, tileattn, os; os.environ['TRITON_INTERPRET'] = '1'\n"
            "x = torch.randn(1, 8, 2, 64).half()\n"
            "try:\n    tileattn.attention(x, x, x)\nexcept ValueError as e:\n    print(e)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert "q is a CPU tensor" in done.stdout and "TRITON_INTERPRET=1" in done.stdout, done.stderr


def test_interpreter_results_are_corrected_without_the_tests_help():
    """A plain script under TRITON_INTERPRET=1 (no conftest, no interpreter_fixes.apply())
    gets bf16 and FP8 results as accurate as the GPU's, and Triton is left unpatched."""
    import os
    code = """
import torch, tileattn
from tileattn.reference import attention_reference
from triton.runtime import interpreter
from tileattn import interpreter_fixes
gen = torch.Generator().manual_seed(0)
x = torch.randn(1, 64, 2, 64, generator=gen)
o = tileattn.attention(*(x.bfloat16(),) * 3)
r, _ = attention_reference(*(x.bfloat16(),) * 3)
print(float((o.double() - r).norm() / r.norm()))
(q8, d), = [tileattn.quantize_fp8(x)]
o8 = tileattn.attention(q8, q8, q8, q_descale=d, k_descale=d, v_descale=d)
r8, _ = attention_reference(q8, q8, q8, q_descale=d, k_descale=d, v_descale=d)
print(float((o8.double() - r8).norm() / r8.norm()))
print(interpreter._convert_float is interpreter_fixes._original_convert_float)
"""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    bf16_error, fp8_error, unpatched = done.stdout.split()
    assert float(bf16_error) < 8e-3 and float(fp8_error) < 5e-2, done.stdout
    assert unpatched == "True"
