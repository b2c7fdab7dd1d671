"""tileattn.flex_attention on the Hopper kernel (block lists and hooks in sm90_tiles.py /
sm90_consumers.py) against torch's eager flex_attention in fp32: every mask and score_mod of
the flex tests, mask block sizes the kernel takes (query blocks of 128 or 256, key blocks of
64 to 256), odd lengths, Sq != Sk, GQA, padded and unequal head dims, rows that see no key,
and score_mod without a block mask. The kernel is forced (use_kernels), and each test checks
that the call did run it. Skipped without an sm90 GPU."""

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

import tileattn
from tileattn.flex import flex_attention
from tileattn.kernels.attention import sm90

from ..conftest import LSE_TOLERANCES, TOLERANCES
from ..flex_cases import check_against_torch
from ..flex_functions import (alibi, causal, distance_bias, doc_ids_for, document, every_op,
                              linear_alibi, prefix_lm, relative_position, sliding_window,
                              softcap, softcapped_document_bias)

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm90 GPU")

DTYPES = [torch.bfloat16, torch.float16]


@pytest.fixture
def launches(monkeypatch):
    """The keyword arguments of every attention_sm90_launch call."""
    calls = []
    launch = sm90.attention_sm90_launch

    def recording(*args, **kwargs):
        calls.append(kwargs)
        return launch(*args, **kwargs)
    monkeypatch.setattr(sm90, "attention_sm90_launch", recording)
    return calls


def _mods(kind, batch, heads, seqlen_q, seqlen_k):
    """(mask_mod or None, score_mod or None) of a named case, on the GPU."""
    gen = torch.Generator(device="cuda").manual_seed(len(kind))
    slopes = torch.rand(heads, device="cuda", generator=gen)
    table = torch.randn(heads, 2 * 64 + 1, device="cuda", generator=gen)
    doc_ids = doc_ids_for(batch, max(seqlen_q, seqlen_k), 5).cuda()
    return {
        "causal": (causal, None),
        "sliding_window": (sliding_window(300), None),
        "document": (document(doc_ids), None),
        "prefix_lm": (prefix_lm(333), None),
        "alibi": (causal, alibi(slopes)),
        "linear_alibi": (causal, linear_alibi(slopes)),
        # No mask: keys on both sides of each query.
        "distance_bias": (None, distance_bias(slopes, torch.randn(batch, heads, device="cuda",
                                                                  generator=gen))),
        "softcap": (causal, softcap(20.0)),
        "relative_position": (None, relative_position(table, 64)),
        "softcapped_document_bias": (document(doc_ids), softcapped_document_bias(
            doc_ids, torch.randn(heads, 8, device="cuda", generator=gen), 30.0)),
        "every_op": (causal, every_op),
        # Rows 0..199 see no key at all: output 0, lse -inf.
        "empty_rows": (lambda b, h, q, kv: (q >= 200) & (kv <= q), None),
    }[kind]


def _arguments(kind, dtype, *, batch=2, heads=4, kv_heads=4, seqlen_q=1000, seqlen_k=1000,
               head_dim=128, head_dim_v=None, block_size=(128, 128)):
    gen = torch.Generator(device="cuda").manual_seed(seqlen_q + head_dim)
    head_dim_v = head_dim_v or head_dim
    query = torch.randn(batch, heads, seqlen_q, head_dim, device="cuda", generator=gen)
    key = torch.randn(batch, kv_heads, seqlen_k, head_dim, device="cuda", generator=gen)
    value = torch.randn(batch, kv_heads, seqlen_k, head_dim_v, device="cuda", generator=gen)
    mask_mod, score_mod = _mods(kind, batch, heads, seqlen_q, seqlen_k)
    block_mask = None
    if mask_mod is not None:
        block_mask = create_block_mask(mask_mod, batch, 1, seqlen_q, seqlen_k, device="cuda",
                                       BLOCK_SIZE=block_size)
    return dict(query=query.to(dtype), key=key.to(dtype), value=value.to(dtype),
                block_mask=block_mask, score_mod=score_mod, enable_gqa=kv_heads != heads)


def _check(arguments, launches):
    with tileattn.use_kernels(attention="sm90"):
        check_against_torch(flex_attention, arguments, TOLERANCES, LSE_TOLERANCES)
    assert [kwargs.get("block_plan") is not None for kwargs in launches] == [
        arguments["block_mask"] is not None], "the Hopper kernel did not run"


KINDS = ["causal", "sliding_window", "document", "prefix_lm", "alibi", "softcap",
         "relative_position", "softcapped_document_bias", "every_op", "empty_rows"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_masks_and_score_mods(kind, dtype, launches):
    _check(_arguments(kind, dtype), launches)


@pytest.mark.parametrize("kind,seqlen_q,seqlen_k", [
    ("linear_alibi", 777, 1537), ("distance_bias", 1000, 1000), ("linear_alibi", 1000, 1000),
    ("distance_bias", 777, 1537)])
def test_linear_score_mods(kind, seqlen_q, seqlen_k, launches):
    """score_mods of flex/linear.py's form run as a term per row and one per key column."""
    _check(_arguments(kind, torch.bfloat16, seqlen_q=seqlen_q, seqlen_k=seqlen_k), launches)
    assert [kwargs.get("score_linear") for kwargs in launches] == [True]


@pytest.mark.parametrize("block_size", [(128, 64), (256, 128), (128, 256), (256, 192)])
@pytest.mark.parametrize("kind", ["causal", "document"])
def test_mask_block_sizes(kind, block_size, launches):
    _check(_arguments(kind, torch.bfloat16, block_size=block_size), launches)


@pytest.mark.parametrize("head_dim,head_dim_v", [(64, 64), (96, 96), (256, 256), (192, 128)])
def test_head_dims(head_dim, head_dim_v, launches):
    _check(_arguments("alibi", torch.bfloat16, head_dim=head_dim, head_dim_v=head_dim_v),
           launches)


@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1000, 1537), (1537, 777), (129, 4000), (1, 300)])
def test_lengths(seqlen_q, seqlen_k, launches):
    _check(_arguments("prefix_lm", torch.float16, seqlen_q=seqlen_q, seqlen_k=seqlen_k),
           launches)


@pytest.mark.parametrize("kind,seqlen_q,seqlen_k,block_size", [
    ("document", 1024, 1024, (128, 128)), ("prefix_lm", 640, 1280, (128, 256)),
    ("sliding_window", 1280, 1024, (256, 128))])
def test_mask_blocks_tiling_the_keys(kind, seqlen_q, seqlen_k, block_size, launches):
    """Mask blocks that tile the keys exactly (no block crossing the sequence end)."""
    _check(_arguments(kind, torch.bfloat16, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
                      block_size=block_size), launches)


def test_gqa(launches):
    _check(_arguments("softcapped_document_bias", torch.bfloat16, heads=8, kv_heads=2),
           launches)


def test_plan_is_cached_per_block_mask(launches):
    from tileattn.flex import tile_plan
    arguments = _arguments("document", torch.bfloat16)
    def plans():
        return {id(mask): id(entry[1]) for mask, entry in tile_plan._PLANS.items()}
    with tileattn.use_kernels(attention="sm90"):
        first = flex_attention(**arguments)
        before = plans()
        second = flex_attention(**arguments)
    assert torch.equal(first, second)
    assert id(arguments["block_mask"]) in before and plans() == before


FP8_KINDS = ["causal", "document", "prefix_lm", "alibi", "softcap", "empty_rows"]


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
@pytest.mark.parametrize("kind", FP8_KINDS)
def test_fp8(kind, dtype, launches, head_dim=128):
    """FP8 with per-tensor descales: V copied K-major in grouped key order (ops/flex.py)."""
    arguments = _arguments(kind, torch.float32, seqlen_q=1000, seqlen_k=1504, head_dim=head_dim)
    for name in ("query", "key", "value"):
        scale = torch.finfo(dtype).max / arguments[name].abs().amax()
        arguments[name] = (arguments[name] * scale).to(dtype)
        arguments[name[0] + "_descale"] = (1.0 / scale).to(torch.float32)
    _check(arguments, launches)


@pytest.mark.parametrize("kind", ["document", "alibi"])
def test_fp8_d256(kind, launches):
    """D=256 FP8 (128-key blocks, the consumers' registers full) with a mask or score hook."""
    test_fp8(kind, torch.float8_e4m3fn, launches, head_dim=256)


@pytest.mark.parametrize("kind,block_size,heads,kv_heads", [
    ("document", (128, 128), 4, 4), ("document", (256, 256), 4, 4),
    ("softcapped_document_bias", (128, 128), 8, 2)])
def test_masks_over_captured_tensors_read_as_bits(kind, block_size, heads, kv_heads, launches,
                                                  monkeypatch):
    """A mask_mod that reads captured tensors goes to the kernel as bits (flex/mask_bits.py):
    the output equals torch's and, bit for bit, the hook's."""
    from tileattn.flex import mask_bits
    arguments = _arguments(kind, torch.bfloat16, heads=heads, kv_heads=kv_heads,
                           block_size=block_size)
    _check(arguments, launches)
    with tileattn.use_kernels(attention="sm90"):
        as_bits = flex_attention(**arguments)
        monkeypatch.setattr(mask_bits, "applies", lambda *args: False)
        as_hook = flex_attention(**arguments)
    assert [kwargs.get("mask_bits") is not None for kwargs in launches] == [True, True, False]
    assert torch.equal(as_bits, as_hook)
