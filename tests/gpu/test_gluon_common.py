"""gluon_common's exponential on the FMA pipe (exp2_on_fma), run on an sm90 GPU against fp64:
the relative error its cubic promises, exact zeros from -inf and below 2^-127, and the
exponent field's wrap-around at both ends of softmax's range (FP8 P reaches 2^8)."""

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm90 GPU")

# The cubic's relative error on [-1/2, 1/2] is 1.0e-4 (gluon_common.EXP2_C1..3).
RELATIVE_ERROR = 1.1e-4


def _exp2_on_fma(x: torch.Tensor) -> torch.Tensor:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    from tileattn.kernels.gluon_common import exp2_on_fma

    @gluon.jit
    def kernel(x_ptr, y_ptr, N: gl.constexpr):
        layout: gl.constexpr = gl.BlockedLayout([N // 128], [32], [4], [0])
        offsets = gl.arange(0, N, layout=layout)
        gl.store(y_ptr + offsets, exp2_on_fma(gl.load(x_ptr + offsets)))

    y = torch.full_like(x, float("nan"))
    kernel[(1,)](x, y, x.numel(), num_warps=4)
    return y


def test_exp2_on_fma_matches_fp64():
    gen = torch.Generator(device="cuda").manual_seed(0)
    edges = torch.tensor([float("-inf"), -1e30, -200.0, -127.0, -126.9, -126.5, -126.0,
                          -125.5, -0.5, -0.0, 0.0, 0.5, 7.5, 8.0], device="cuda")
    spread = torch.rand(4096 - 2 * edges.numel(), device="cuda", generator=gen) * 140 - 132
    x = torch.cat([edges, spread, edges.clamp(min=-126) + 0.25]).contiguous()
    y = _exp2_on_fma(x)
    ref = torch.exp2(x.double())
    assert not y.isnan().any()
    assert (y >= 0).all()
    assert (y[x <= -127] == 0).all()                 # -inf's weight is exactly 0
    normal = ref >= 2.0 ** -125
    error = ((y.double() - ref)[normal].abs() / ref[normal]).max()
    assert error < RELATIVE_ERROR, float(error)
    # Between 2^-127 and 2^-125 the result may be subnormal: absolutely tiny either way.
    assert ((y.double() - ref)[~normal].abs() <= 2.0 ** -124).all()
