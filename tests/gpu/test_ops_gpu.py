"""The custom-op, compile and autograd tests of tests/test_ops.py and tests/test_autograd.py on
the GPU (fast tier; their DEVICE is "cuda" there): opcheck, torch.compile(fullgraph=True) with
inductor and aot_eager, forward and backward, eager autograd against the ops' own, FP8
descales and return_lse, the training run against SDPA; and compiled code captured in CUDA
graphs (mode="reduce-overhead")."""

import pytest
import torch

import tileattn

from ..test_autograd import (test_attention_op_autograd_opcheck,  # noqa: F401 (collected)
                             test_compile_forward_and_backward_matches_eager,
                             test_eager_autograd_equals_the_ops_registered_autograd,
                             test_gradients_through_a_fused_qkv_buffer_and_lse,
                             test_second_derivatives_raise, test_training_tracks_sdpa,
                             test_varlen_gradients, test_what_has_no_backward_is_refused_by_name)
from ..test_ops import (test_attention_opcheck, test_attention_varlen_opcheck,  # noqa: F401
                        test_compile_fullgraph_matches_eager, test_compile_varlen_and_mla,
                        test_mla_decode_opcheck)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_reduce_overhead_replays_a_cuda_graph(dtype):
    """torch.compile's CUDA-graph mode captures a layer calling tileattn and replays it on new
    input values with the same results as eager."""
    def inputs(seed):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        q, k, v = (torch.randn(2, 300, 4, 128, device="cuda", generator=gen) for _ in range(3))
        if dtype.itemsize == 2:
            return (q.to(dtype), k.to(dtype), v.to(dtype)), {}
        (q, qd), (k, kd), (v, vd) = (tileattn.quantize_fp8(x, dtype) for x in (q, k, v))
        return (q, k, v), dict(q_descale=qd, k_descale=kd, v_descale=vd)

    def layer(q, k, v, descales):
        out, lse = tileattn.attention(q, k, v, causal=True, return_lse=True, **descales)
        return out.float() + 1, lse
    torch._dynamo.reset()
    compiled = torch.compile(layer, mode="reduce-overhead", fullgraph=True)
    for seed in range(4):          # warm-up, recording, then replays
        (q, k, v), descales = inputs(seed)
        out, lse = compiled(q, k, v, descales)
        expected_out, expected_lse = layer(q, k, v, descales)
        assert torch.equal(out, expected_out) and torch.equal(lse, expected_lse), seed
