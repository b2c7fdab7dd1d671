"""Packed (varlen) sequences on the Hopper Gluon kernel against the fp64 reference, on an sm90
GPU: per-sequence bottom-right causal masks over unequal query and key lengths, empty
sequences on either side, single tokens, GQA, every head-dim family, softcap and left windows;
outputs poisoned with NaN first. Also: attention_varlen dispatches here, ALiBi included.
Skipped elsewhere."""

import pytest
import torch

import tileattn
from tileattn import dispatch
from tileattn.kernels.attention import fwd, sm90
from tileattn.ops import attention as attention_op
from tileattn.reference import attention_varlen_reference

from ..conftest import LSE_TOLERANCES, TOLERANCES

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm90 GPU")

# Query and key lengths per sequence: more keys than queries, empty on either side, one token,
# a long one, more queries than keys.
LENGTHS_Q = [1000, 0, 1, 3000, 517, 64, 300]
LENGTHS_K = [1200, 77, 1, 3000, 0, 64, 129]


def _packed(head_dim, dtype, head_dim_v=None, heads=(8, 2)):
    gen = torch.Generator(device="cuda").manual_seed(head_dim)
    cu_q, cu_k = (torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
                  for lengths in (LENGTHS_Q, LENGTHS_K))
    q = torch.randn(int(cu_q[-1]), heads[0], head_dim, device="cuda", generator=gen)
    k = torch.randn(int(cu_k[-1]), heads[1], head_dim, device="cuda", generator=gen)
    v = torch.randn(int(cu_k[-1]), heads[1], head_dim_v or head_dim, device="cuda",
                    generator=gen)
    return q.to(dtype), k.to(dtype), v.to(dtype), cu_q, cu_k


def _assert_close(out, lse, q, k, v, cu_q, cu_k, causal, **masks):
    ref, ref_lse = attention_varlen_reference(q, k, v, cu_q, cu_k, causal=causal, **masks)
    assert not out.isnan().any() and not lse.isnan().any()
    error = float((out.double() - ref).norm() / ref.norm())
    assert error < TOLERANCES[q.dtype], error
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    assert ((lse.double() - ref_lse)[finite].abs() / ref_lse[finite].abs().clamp(min=1)).max() \
        < LSE_TOLERANCES[q.dtype]


@pytest.mark.parametrize("dtype, head_dim, head_dim_v, causal, softcap, left", [
    (torch.bfloat16, 128, 128, True, 0.0, -1), (torch.bfloat16, 128, 128, False, 0.0, -1),
    (torch.float16, 64, 64, True, 0.0, -1), (torch.float16, 256, 256, True, 0.0, -1),
    (torch.bfloat16, 192, 128, False, 0.0, -1), (torch.bfloat16, 128, 128, True, 20.0, 300),
    (torch.bfloat16, 128, 128, False, 0.0, 200),
], ids=lambda p: str(p).replace("torch.", ""))
def test_varlen(dtype, head_dim, head_dim_v, causal, softcap, left):
    q, k, v, cu_q, cu_k = _packed(head_dim, dtype, head_dim_v)
    q = q * 3 if softcap else q
    out = torch.full((q.shape[0], q.shape[1], v.shape[2]), float("nan"), dtype=dtype,
                     device="cuda")
    lse = torch.full((q.shape[1], q.shape[0]), float("nan"), device="cuda")
    sequences = fwd.Sequences(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(LENGTHS_Q),
                              max_seqlen_k=max(LENGTHS_K), block_table=None)
    assert sm90.supports_packed(q, k, v)
    sm90.attention_sm90_launch(q, k, v, out, lse, head_dim ** -0.5, causal, softcap=softcap,
                               window_left=left, sequences=sequences).run()
    _assert_close(out, lse, q, k, v, cu_q, cu_k, causal, softcap=softcap,
                  window_size=(left, 0 if causal else -1))


def test_attention_varlen_dispatches_here(monkeypatch):
    """attention_varlen runs this kernel for causal, left windows and ALiBi (its score hook,
    with softcap; causal: as row and column terms), and agrees with the reference."""
    monkeypatch.setattr(dispatch, "SM90_MIN_WORK", 0)
    attention_op._VARLEN_CALLS.clear()     # five signatures: each builds its launch once
    launched = []
    original = sm90.attention_sm90_launch
    monkeypatch.setattr(sm90, "attention_sm90_launch",
                        lambda *a, **kw: launched.append(kw.get("sequences") is not None)
                        or original(*a, **kw))
    q, k, v, cu_q, cu_k = _packed(128, torch.bfloat16)
    for masks in (dict(causal=True), dict(causal=True, window_size=(500, 0)),
                  dict(alibi_slopes=torch.rand(8, device="cuda")),
                  dict(causal=True, softcap=30.0, alibi_slopes=torch.rand(7, 8, device="cuda")),
                  # Causal ALiBi runs as row and column terms (flex/linear.py), with a window too.
                  dict(causal=True, window_size=(300, 0),
                       alibi_slopes=torch.rand(8, device="cuda"))):
        out, lse = tileattn.attention_varlen(q, k, v, cu_q, cu_k, max(LENGTHS_Q), max(LENGTHS_K),
                                             return_lse=True, **masks)
        _assert_close(out, lse, q, k, v, cu_q, cu_k, **dict(dict(causal=False), **masks))
    assert launched == [True] * 5


@pytest.mark.parametrize("kernel, dtype", [("sm90", torch.bfloat16), ("portable", torch.bfloat16),
                                           ("auto", torch.float8_e4m3fn)], ids=str)
def test_repeat_varlen_calls_replay(kernel, dtype, monkeypatch):
    """A repeated attention_varlen signature replays its bound launch (the varlen call cache):
    each call reads its own cu_seqlens (other sequences, same shapes), values, scale, ALiBi
    slopes and descales (the Hopper kernel rebuilds its work lists; FP8 V is copied K-major
    again), each against its own reference."""
    monkeypatch.setattr(dispatch, "SM90_MIN_WORK", 0)
    attention_op._VARLEN_CALLS.clear()
    pairs = list(zip(LENGTHS_Q, LENGTHS_K))
    for seed in range(3):
        order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(seed)).tolist()
        lengths_q, lengths_k = ([pairs[i][j] for i in order] for j in (0, 1))
        cu_q, cu_k = (torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
                      for lengths in (lengths_q, lengths_k))
        gen = torch.Generator(device="cuda").manual_seed(seed)
        q = torch.randn(int(cu_q[-1]), 8, 128, device="cuda", generator=gen)
        k, v = (torch.randn(int(cu_k[-1]), 2, 128, device="cuda", generator=gen) for _ in range(2))
        options = dict(causal=True, softmax_scale=0.05 * (seed + 1),
                       alibi_slopes=torch.rand(8, device="cuda", generator=gen))
        if dtype == torch.float8_e4m3fn:
            (q, qd), (k, kd), (v, vd) = (tileattn.quantize_fp8(x[None], dtype) for x in (q, k, v))
            q, k, v = q[0], k[0], v[0]
            options.update(q_descale=qd, k_descale=kd, v_descale=vd)
        else:
            q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        with tileattn.use_kernels(attention=kernel):
            out, lse = tileattn.attention_varlen(q, k, v, cu_q, cu_k, max(LENGTHS_Q),
                                                 max(LENGTHS_K), return_lse=True, **options)
        _assert_close(out, lse, q, k, v, cu_q, cu_k, **options)
    assert len(attention_op._VARLEN_CALLS._entries) == 1


def test_repeat_paged_prefill_calls_replay(monkeypatch):
    """Paged prefill (the portable kernel) replays too, reading each call's block_table: the
    same sequences in other pages, against the reference over the packed keys."""
    attention_op._VARLEN_CALLS.clear()
    page, lengths_q, lengths_k = 16, [300, 17, 100], [333, 40, 129]
    cu_q, cu_k = (torch.tensor([0] + l, device="cuda").cumsum(0).to(torch.int32)
                  for l in (lengths_q, lengths_k))
    pages_per = [-(-n // page) for n in lengths_k]
    num_pages = sum(pages_per) + 5
    for seed in range(3):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        q = torch.randn(sum(lengths_q), 8, 128, device="cuda", generator=gen).bfloat16()
        k, v = (torch.randn(sum(lengths_k), 2, 128, device="cuda", generator=gen).bfloat16()
                for _ in range(2))
        order = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed)).tolist()
        table = torch.zeros(len(lengths_k), max(pages_per), dtype=torch.int32)
        k_cache, v_cache = (torch.randn(num_pages, page, 2, 128, device="cuda",
                                        generator=gen).bfloat16() for _ in range(2))
        for b, n in enumerate(lengths_k):
            for p in range(pages_per[b]):
                table[b, p] = order.pop()
                rows = slice(int(cu_k[b]) + p * page, int(cu_k[b]) + min(n, (p + 1) * page))
                k_cache[table[b, p], :rows.stop - rows.start] = k[rows]
                v_cache[table[b, p], :rows.stop - rows.start] = v[rows]
        out, lse = tileattn.attention_varlen(q, k_cache, v_cache, cu_q, cu_k, max(lengths_q),
                                             max(lengths_k), causal=True,
                                             block_table=table.cuda(), return_lse=True)
        _assert_close(out, lse, q, k, v, cu_q, cu_k, causal=True)
    assert len(attention_op._VARLEN_CALLS._entries) == 1
