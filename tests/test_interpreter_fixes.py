"""The CPU interpreter, as corrected by tileattn/interpreter_fixes.py, rounds and multiplies like
the GPU: FP8 and bf16 casts match torch's (round to nearest even, FP8 saturating, NaN kept) and
a bf16 tl.dot matches an fp32 matmul. Each test fails on Triton 3.6.0's own interpreter."""

import os

import pytest
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="checks the CPU interpreter")


@triton.jit
def _round_trip_kernel(x_ptr, e4m3_ptr, e5m2_ptr, bf16_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    tl.store(e4m3_ptr + offs, x.to(tl.float8e4nv).to(tl.float32))
    tl.store(e5m2_ptr + offs, x.to(tl.float8e5).to(tl.float32))
    tl.store(bf16_ptr + offs, x.to(tl.bfloat16).to(tl.float32))


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr):
    offs = tl.arange(0, M)
    tile = offs[:, None] * M + offs[None, :]
    tl.store(c_ptr + tile, tl.dot(tl.load(a_ptr + tile), tl.load(b_ptr + tile)))


def test_float_casts_round_like_the_gpu():
    gen = torch.Generator().manual_seed(0)
    x = torch.cat([
        torch.rand(1000, generator=gen),                     # includes values rounding up to 2^k
        torch.tensor([0.49, 0.499, 0.124, 0.0312, 0.0037]),  # ... e.g. 0.49 -> 0.5 in e4m3
        torch.tensor([0.5625 + 0.03125, 0.625 + 0.03125]),   # ties: to even
        torch.tensor([500.0, -1000.0, 1e6, float("nan"), 0.0, -0.0, 1e-9]),
        torch.randn(10, generator=gen) * 100,
    ])
    x = torch.cat([x, torch.zeros(1024 - x.numel())])
    e4m3, e5m2, bf16 = (torch.empty_like(x) for _ in range(3))
    _round_trip_kernel[(1,)](x, e4m3, e5m2, bf16, 1024)
    for got, dtype in ((e4m3, torch.float8_e4m3fn), (e5m2, torch.float8_e5m2)):
        finite = torch.finfo(dtype).max
        want = torch.where(x.isnan(), x, x.clamp(-finite, finite)).to(dtype).float()
        assert torch.equal(got.isnan(), want.isnan()), dtype
        assert torch.equal(got[~want.isnan()], want[~want.isnan()]), dtype
    want = x.to(torch.bfloat16).float()
    assert torch.equal(bf16[~x.isnan()], want[~x.isnan()]) and bf16[x.isnan()].isnan().all()


def test_fp8_nan_reads_as_nan():
    bits = torch.tensor([0x7F, 0xFF, 0x01, 0x80 | 0x01, 0x38] + [0] * 11, dtype=torch.uint8)
    values = torch.empty(16)

    @triton.jit
    def upcast(src_ptr, dst_ptr):
        offs = tl.arange(0, 16)
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs).to(tl.float32))

    upcast[(1,)](bits.view(torch.float8_e4m3fn), values)
    want = bits.view(torch.float8_e4m3fn).float()
    assert values[:2].isnan().all()
    assert torch.equal(values[2:], want[2:])


def test_bf16_dot_multiplies_values():
    gen = torch.Generator().manual_seed(1)
    a, b = (torch.randn(32, 32, generator=gen).bfloat16() for _ in range(2))
    c = torch.empty(32, 32)
    _dot_kernel[(1,)](a, b, c, 32)
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-5, atol=1e-5)


def test_libdevice_tanh_and_pow_run():
    @triton.jit
    def tanh_pow(x_ptr, tanh_ptr, pow_ptr):
        offs = tl.arange(0, 64)
        x = tl.load(x_ptr + offs)
        tl.store(tanh_ptr + offs, libdevice.tanh(x))
        tl.store(pow_ptr + offs, libdevice.pow(tl.abs(x), tl.full([], 1.5, tl.float32)))

    x = torch.randn(64, generator=torch.Generator().manual_seed(2)) * 3
    tanh, power = torch.empty_like(x), torch.empty_like(x)
    tanh_pow[(1,)](x, tanh, power)
    torch.testing.assert_close(tanh, torch.tanh(x), rtol=2e-7, atol=2e-7)
    torch.testing.assert_close(power, x.abs() ** 1.5, rtol=2e-7, atol=2e-7)
