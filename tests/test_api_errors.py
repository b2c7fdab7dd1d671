"""Every bad input to attention() gets a ValueError/TypeError that names the argument."""

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
    "empty q": (lambda: inputs(seqlen_q=0), {}, ValueError, "q must not be empty"),
    "float32 input": (lambda: inputs(dtype=torch.float32), {}, TypeError, "q must be float16"),
    "mixed dtypes": (lambda: (inputs()[0], inputs()[1].bfloat16(), inputs()[2]), {}, TypeError, "share one dtype"),
    "batch mismatch": (lambda: (inputs(batch=2)[0], *inputs()[1:]), {}, ValueError, "batch sizes differ"),
    "k/v seqlen mismatch": (lambda: (*inputs()[:2], inputs(seqlen_k=9)[2]), {}, ValueError, "same seqlen"),
    "k/v heads mismatch": (lambda: (*inputs()[:2], inputs(num_kv_heads=1)[2]), {}, ValueError, "same number of heads"),
    "heads not a multiple": (lambda: inputs(num_q_heads=3), {}, ValueError, "multiple of k's heads"),
    "q/k head_dim mismatch": (lambda: (inputs(head_dim=128)[0], *inputs()[1:]), {}, ValueError, "same head_dim"),
    "unsupported head_dim": (lambda: inputs(head_dim=80, head_dim_v=64), {}, ValueError, "q/k head_dim must be one of"),
    "unsupported v head_dim": (lambda: inputs(head_dim_v=48), {}, ValueError, "v head_dim must be one of"),
    "q last dim strided": (lambda: (torch.randn(1, 8, 4, 128).half()[..., ::2], *inputs()[1:]), {}, ValueError, "q must have a contiguous last dim"),
    "v neither layout": (lambda: (*inputs()[:2], torch.randn(1, 8, 2, 128).half()[..., ::2]), {}, ValueError, "v must have a contiguous last dim or a contiguous seqlen dim"),
    "descale on fp16": (lambda: inputs(), {"q_descale": torch.ones(())}, ValueError, "apply only to FP8"),
    "descale wrong dtype": (fp8_inputs, {"k_descale": torch.ones((), dtype=torch.float64)}, TypeError, "k_descale must be float32"),
    "descale wrong shape": (fp8_inputs, {"v_descale": torch.ones(1, 4)}, ValueError, "v_descale must have shape [] (per tensor) or [1, 2]"),
    "q descale uses kv heads": (fp8_inputs, {"q_descale": torch.ones(1, 2)}, ValueError, "q_descale must have shape [] (per tensor) or [1, 4]"),
    "descale not a tensor": (fp8_inputs, {"q_descale": 1.0}, TypeError, "q_descale must be a float32 torch.Tensor"),
    "causal not bool": (lambda: inputs(), {"causal": 1}, TypeError, "causal must be a bool"),
    "negative softmax_scale": (lambda: inputs(), {"softmax_scale": -1.0}, ValueError, "softmax_scale must be"),
    "bad out_dtype": (lambda: inputs(), {"out_dtype": torch.int8}, TypeError, "out_dtype must be"),
    # No backward pass: a differentiable input would get an output carrying no gradient.
    "k requires grad": (lambda: (inputs()[0], inputs()[1].requires_grad_(), inputs()[2]), {},
                        ValueError, "k requires grad, but tileattn.attention has no backward"),
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
