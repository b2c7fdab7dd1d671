"""The custom ops (tileattn/ops/library.py): torch.library.opcheck over a small grid, and
torch.compile(fullgraph=True) of code calling the public functions, with inductor and
aot_eager, against eager results (the interpreter on the CPU)."""

import pytest
import torch

import tileattn
from tileattn.ops import library, mla as mla_op

from .test_attention import DEVICE, make_inputs

E4M3 = torch.float8_e4m3fn
SLOPES = torch.tensor([0.5, 0.25], device=DEVICE)


def _attention_args(dtype, causal=False, window=(-1, -1), softcap=0.0, alibi=None):
    q, k, v, descales = make_inputs((1, 20, 33, 2, 1, 64, 64, False), dtype)
    return (q, k, v, causal, 0.125, *window, softcap, alibi, descales.get("q_descale"),
            descales.get("k_descale"), descales.get("v_descale"), None, False)


@pytest.mark.parametrize("case", ["fp16", "bf16-causal", "fp8", "window-softcap-alibi"])
def test_attention_opcheck(case):
    args = {"fp16": lambda: _attention_args(torch.float16),
            "bf16-causal": lambda: _attention_args(torch.bfloat16, causal=True),
            "fp8": lambda: _attention_args(E4M3, causal=True),
            "window-softcap-alibi": lambda: _attention_args(torch.float16, True, (5, -1), 2.0,
                                                            SLOPES)}[case]()
    # test_schema compares inputs by arithmetic that CPU torch lacks for FP8.
    utils = ("test_faketensor", "test_aot_dispatch_static") if case == "fp8" else (
        "test_schema", "test_faketensor", "test_aot_dispatch_static")
    torch.library.opcheck(library.attention, args, test_utils=utils)


def test_attention_varlen_opcheck():
    q = torch.randn(9, 2, 64, device=DEVICE).half()
    k = torch.randn(12, 1, 64, device=DEVICE).half()
    cu_q = torch.tensor([0, 4, 9], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 5, 12], dtype=torch.int32, device=DEVICE)
    args = (q, k, k, cu_q, cu_k, 5, 7, True, 0.125, -1, -1, 0.0, None, None, None, None, None,
            None, False)
    torch.library.opcheck(library.attention_varlen, args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


def test_mla_decode_opcheck():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 1, 16, 576, generator=gen).half().to(DEVICE)
    kv = torch.randn(6, 16, 576, generator=gen).half().to(DEVICE)
    table = torch.arange(6, dtype=torch.int32, device=DEVICE).reshape(2, 3)
    seq_lens = torch.tensor([40, 17], dtype=torch.int32, device=DEVICE)
    plan = tileattn.mla_plan(seq_lens, num_heads=16, page_size=16, kv_dtype=torch.float16,
                             device=DEVICE)
    args = (q, kv, table, seq_lens, 0.07, None, plan.work, plan.batch_slots, plan.partial_out,
            plan.partial_lse, mla_op.plan_fields(plan))
    torch.library.opcheck(library.mla_decode, args,
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("dtype", [torch.float16, E4M3])
def test_compile_fullgraph_matches_eager(backend, dtype):
    q, k, v, descales = make_inputs((1, 20, 33, 2, 1, 64, 64, False), dtype)

    def layer(q, k, v, descales):
        out, lse = tileattn.attention(q, k, v, causal=True, return_lse=True, softcap=4.0,
                                      **descales)
        return out.float() * 2, lse
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    out, lse = compiled(q, k, v, descales)
    expected_out, expected_lse = layer(q, k, v, descales)
    assert torch.equal(out, expected_out) and torch.equal(lse, expected_lse)


def test_compile_varlen_and_mla():
    q = torch.randn(9, 2, 64, device=DEVICE).half()
    k = torch.randn(12, 1, 64, device=DEVICE).half()
    cu_q = torch.tensor([0, 4, 9], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 5, 12], dtype=torch.int32, device=DEVICE)
    fn = lambda q, k: tileattn.attention_varlen(q, k, k, cu_q, cu_k, 5, 7, causal=True)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k), fn(q, k))

    gen = torch.Generator().manual_seed(0)
    qm = torch.randn(2, 1, 16, 576, generator=gen).half().to(DEVICE)
    kv = torch.randn(6, 16, 576, generator=gen).half().to(DEVICE)
    table = torch.arange(6, dtype=torch.int32, device=DEVICE).reshape(2, 3)
    seq_lens = torch.tensor([40, 17], dtype=torch.int32, device=DEVICE)
    plan = tileattn.mla_plan(seq_lens, num_heads=16, page_size=16, kv_dtype=torch.float16,
                             device=DEVICE)
    decode = lambda qm: tileattn.mla_decode(qm, kv, table, seq_lens, softmax_scale=0.07,
                                            plan=plan)
    assert torch.equal(torch.compile(decode, fullgraph=True, backend="aot_eager")(qm), decode(qm))
