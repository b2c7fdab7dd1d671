"""quantize_fp8 and prepare_v."""

import pytest
import torch

import tileattn
from tileattn import fp8
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
    # Rows of 80 keys (whole groups of 16), the padding zero-filled.
    out = torch.full((2, 3, head_dim, 80), float("nan"), device=device).to(v.dtype)
    transpose_v_launch(v, out).run()
    assert torch.equal(out[..., :77].permute(0, 3, 1, 2).float(), v.float())
    assert (out[..., 77:].float() == 0).all()


@pytest.mark.parametrize("seqlen", [1, 17, 40, 64, 100])
def test_grouped_key_order(seqlen):
    """k_major_copy(grouped=True) stores key 16a + 8j + 2q + b at column 16a + 4q + 2j + b of
    each group of 16 (the order in which wgmma's threads hold S columns), padding zero."""
    from tileattn.kernels.attention.layout import k_major_width
    device = "cuda" if torch.cuda.is_available() else "cpu"
    v = torch.randn(2, seqlen, 3, 64, device=device).to(torch.float8_e4m3fn)
    width = k_major_width(seqlen)
    buffer = fp8._k_major_storage(fp8.k_major_copy(v, grouped=True)).float()
    column = [key - key % 16 + (key % 8 // 2) * 4 + (key % 16 // 8) * 2 + key % 2
              for key in range(width)]
    padded = torch.zeros(2, width, 3, 64, device=device)
    padded[:, :seqlen] = v.float()
    expected = torch.zeros(2, 3, 64, width, device=device)
    expected[..., column] = padded.permute(0, 2, 3, 1)
    assert torch.equal(buffer, expected)
    natural = fp8.k_major_copy(v)
    assert natural.shape == v.shape and torch.equal(natural.float(), v.float())
