"""quantize_fp8 and prepare_v."""

import pytest
import torch

import tileattn
from tileattn.fp8 import is_k_major


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
@pytest.mark.parametrize("per", ["tensor", "head"])
def test_quantize_round_trip(dtype, per):
    x = torch.randn(2, 33, 3, 64) * torch.tensor([1.0, 10.0, 0.01])[None, None, :, None]
    x_fp8, descale = tileattn.quantize_fp8(x, dtype, per=per)
    assert x_fp8.dtype == dtype and descale.dtype == torch.float32
    assert descale.shape == (() if per == "tensor" else (2, 3))
    scale = descale if per == "tensor" else descale[:, None, :, None]
    back = x_fp8.float() * scale
    # Relative error of one rounding: 2^-4 for e4m3 (3 mantissa bits), 2^-3 for e5m2.
    bound = 2**-4 if dtype == torch.float8_e4m3fn else 2**-3
    if per == "head":  # each head uses its own range, so even the quiet head keeps precision
        assert ((back - x).norm(dim=(1, 3)) / x.norm(dim=(1, 3))).max() < bound
    assert (back - x).norm() / x.norm() < bound
    assert x_fp8.float().abs().max() <= torch.finfo(dtype).max


def test_zero_input_keeps_unit_scale():
    x_fp8, descale = tileattn.quantize_fp8(torch.zeros(1, 4, 2, 64))
    assert torch.all(x_fp8.float() == 0) and float(descale) == 1.0


def test_prepare_v_layout():
    v = torch.randn(2, 50, 3, 64)
    v_k_major = tileattn.prepare_v(v)
    assert v_k_major.shape == v.shape and v_k_major.stride(1) == 1
    assert is_k_major(v_k_major) and not is_k_major(v)
    assert torch.equal(v_k_major, v)


@pytest.mark.parametrize("head_dim", [64, 96])
def test_transpose_kernel(head_dim):
    """The Triton transpose behind prepare_v on CUDA, run directly (interpreter on CPU)."""
    from tileattn.kernels.attention.layout import transpose_v_launch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    fused = torch.randn(2, 77, 2, 3, head_dim, device=device).to(torch.float8_e4m3fn)
    v = fused[:, :, 1]  # strided, as when sliced from a fused kv buffer
    out = torch.zeros(2, 3, head_dim, 77, dtype=v.dtype, device=device)
    transpose_v_launch(v, out).run()
    assert torch.equal(out.permute(0, 3, 1, 2).float(), v.float())
