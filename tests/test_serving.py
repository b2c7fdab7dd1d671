"""Serving features against the fp64 reference, on the real kernel (the interpreter on the CPU):
sliding windows, softcap and ALiBi on attention(); attention_varlen() over packed and paged
K/V; and the bad inputs of both."""

import pytest
import torch

import tileattn
from tileattn.fp8 import packed_k_major_copy
from tileattn.kernels.attention.layout import V_ALIGN, packed_v_width
from tileattn.ops import attention as ops_attention
from tileattn.reference import attention_reference, attention_varlen_reference

from .conftest import LSE_TOLERANCES, TOLERANCES
from .test_attention import DEVICE, make_inputs, relative_error

E4M3 = torch.float8_e4m3fn
SLOPES = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=DEVICE)


def assert_matches(out, lse, ref, ref_lse, dtype):
    assert torch.isfinite(out).all(), "output has NaN/inf"
    assert relative_error(out, ref) < TOLERANCES[dtype]
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse)), "rows with no visible key differ"
    finite = torch.isfinite(ref_lse)
    error = (lse.double()[finite] - ref_lse[finite]).abs() / ref_lse[finite].abs().clamp(min=1)
    assert error.numel() == 0 or float(error.max()) < LSE_TOLERANCES[dtype]


MASKS = {
    "window-causal": dict(causal=True, window_size=(16, -1)),
    "window-both-sides": dict(window_size=(10, 5)),
    "window-right-only": dict(window_size=(-1, 3)),
    "softcap": dict(softcap=2.0),
    "alibi-causal": dict(causal=True, alibi_slopes=SLOPES),
    "alibi-per-batch": dict(alibi_slopes=torch.stack([SLOPES, SLOPES.flip(0)])),
    "all": dict(causal=True, window_size=(20, -1), softcap=3.0, alibi_slopes=SLOPES),
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, E4M3])
@pytest.mark.parametrize("mask", MASKS)
def test_masks_match_reference(mask, dtype):
    """Sq < Sk, GQA 4/2, odd lengths: windows cross block edges on both sides."""
    q, k, v, descales = make_inputs((2, 45, 70, 4, 2, 64, 64, False), dtype, seed=3)
    kwargs = MASKS[mask]
    out, lse = tileattn.attention(q, k, v, return_lse=True, **kwargs, **descales)
    ref, ref_lse = attention_reference(q, k, v, **kwargs, **descales)
    assert_matches(out, lse, ref, ref_lse, dtype)


def test_window_with_rows_that_see_nothing():
    """Sq > Sk with a right bound: the first rows see no key (0 and lse -inf)."""
    q, k, v, _ = make_inputs((1, 60, 20, 2, 2, 64, 64, False), torch.float16)
    out, lse = tileattn.attention(q, k, v, window_size=(4, 0), return_lse=True)
    ref, ref_lse = attention_reference(q, k, v, window_size=(4, 0))
    assert bool(torch.isinf(lse).any())
    assert_matches(out, lse, ref, ref_lse, torch.float16)


def _packed(lengths, heads, dim, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(lengths), heads, dim, generator=gen).to(DEVICE)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32,
                      device=DEVICE)
    return x, cu


def _quantize(x, dtype):
    if dtype != E4M3:
        return x.to(dtype), None
    x8, descale = tileattn.quantize_fp8(x[None], dtype)
    return x8[0], descale


def _paged(x, cu, page_size, seed):
    """x [total, H, D] moved into shuffled pages; unused table slots hold garbage ids."""
    gen = torch.Generator().manual_seed(seed)
    lengths = (cu[1:] - cu[:-1]).tolist()
    per_seq = [-(-n // page_size) for n in lengths]
    max_pages = max(max(per_seq), 1)
    num_pages = sum(per_seq) + 3
    order = torch.randperm(num_pages, generator=gen).tolist()
    cache = torch.randn(num_pages, page_size, *x.shape[1:], generator=gen).to(x.dtype).to(DEVICE)
    table = torch.full((len(lengths), max_pages), 10**6, dtype=torch.int32)
    for b, n in enumerate(lengths):
        for p in range(per_seq[b]):
            page = order.pop()
            table[b, p] = page
            rows = x[int(cu[b]) + p * page_size: int(cu[b]) + min(n, (p + 1) * page_size)]
            cache[page, :rows.shape[0]] = rows
    return cache, table.to(DEVICE)


# (lengths_q, lengths_k): empty, single-token and decode-like sequences mixed with prefill.
VARLEN = ([5, 0, 40, 1, 3], [9, 3, 40, 37, 0])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, E4M3])
@pytest.mark.parametrize("layout", ["packed", "paged-1", "paged-16", "paged-64"])
@pytest.mark.parametrize("mask", ["none", "causal", "window-softcap-alibi"])
def test_varlen_matches_reference(layout, mask, dtype):
    lengths_q, lengths_k = VARLEN
    q, cu_q = _packed(lengths_q, 4, 64, dtype, 1)
    k, cu_k = _packed(lengths_k, 2, 64, dtype, 2)
    v, _ = _packed(lengths_k, 2, 128, dtype, 3)          # Dv != D
    (q, qd), (k, kd), (v, vd) = (_quantize(x, dtype) for x in (q, k, v))
    descales = dict(q_descale=qd, k_descale=kd, v_descale=vd) if dtype == E4M3 else {}
    kwargs = {"none": {}, "causal": dict(causal=True),
              "window-softcap-alibi": dict(causal=True, window_size=(8, -1), softcap=5.0,
                                           alibi_slopes=SLOPES)}[mask]
    table = None
    if layout.startswith("paged"):
        page_size = int(layout.split("-")[1])
        k, table = _paged(k, cu_k, page_size, 4)
        v, _ = _paged(v, cu_k, page_size, 4)
    out, lse = tileattn.attention_varlen(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                         block_table=table, return_lse=True, **kwargs,
                                         **descales)
    ref, ref_lse = attention_varlen_reference(q, k, v, cu_q, cu_k, block_table=table, **kwargs,
                                              **descales)
    assert out.shape == (sum(lengths_q), 4, 128) and lse.shape == (4, sum(lengths_q))
    assert_matches(out, lse, ref, ref_lse, dtype)


def test_varlen_equals_dense_per_sequence():
    """Packing changes nothing: each sequence's rows equal attention() on it alone."""
    lengths = [17, 33]
    q, cu = _packed(lengths, 2, 64, torch.float16, 5)
    k, _ = _packed(lengths, 2, 64, torch.float16, 6)
    q, k = q.half(), k.half()
    out = tileattn.attention_varlen(q, k, k, cu, cu, 33, 33, causal=True)
    for b in range(2):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        dense = tileattn.attention(q[None, rows], k[None, rows], k[None, rows], causal=True)
        assert torch.allclose(out[rows], dense[0], atol=1e-3)


@pytest.mark.parametrize("kernel", ["prefill", "decode"])
def test_bad_page_ids_raise_or_give_nan_rows(kernel):
    """Outside graph capture a bad id raises; with validate=False (a captured graph's case:
    the decode path then needs a plan) it is never followed and its sequence comes out NaN."""
    lengths = [9, 20]
    q_lengths = [2, 3] if kernel == "decode" else [2, 17]
    q, cu = _packed(q_lengths, 2, 64, torch.float16, 7)
    k, cu_k = _packed(lengths, 2, 64, torch.float16, 8)
    q, k = q.half(), k.half()
    cache, table = _paged(k, cu_k, 4, 9)
    plan = None
    if kernel == "decode":
        plan = tileattn.decode_plan(cu_seqlens_k=cu_k, num_q_heads=2, num_kv_heads=2, q_len=3,
                                    page_size=4, head_dim=64, kv_dtype=torch.float16)
    table[1, 2] = cache.shape[0] + 5
    with pytest.raises(ValueError, match=r"block_table\[1, 2\] = .* is not a page of k"):
        tileattn.attention_varlen(q, cache, cache, cu, cu_k, max(q_lengths), 20,
                                  block_table=table, plan=plan)
    if kernel == "decode" and DEVICE == "cpu":
        return   # the decode path reads host-side index tensors always (they cost nothing)
    out = tileattn.attention_varlen(q, cache, cache, cu, cu_k, max(q_lengths), 20,
                                    block_table=table, validate=False, plan=plan)
    first = q_lengths[0]
    assert bool(out[first:].isnan().all()) and bool(out[:first].isfinite().all())


def _varlen_args(**changes):
    q, cu_q = _packed([3, 4], 2, 64, torch.float16, 10)
    k, cu_k = _packed([5, 6], 2, 64, torch.float16, 11)
    args = dict(q=q.half(), k=k.half(), v=k.half(), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                max_seqlen_q=4, max_seqlen_k=6)
    args.update(changes)
    return args


VARLEN_ERRORS = {
    "cu_seqlens int64": (dict(cu_seqlens_q=torch.tensor([0, 3, 7])), TypeError,
                         "cu_seqlens_q must be int32"),
    "cu_seqlens wrong length": (dict(cu_seqlens_k=torch.tensor([0, 11], dtype=torch.int32)),
                                ValueError, "cu_seqlens_k must have cu_seqlens_q's length"),
    "cu_seqlens not from 0": (dict(cu_seqlens_q=torch.tensor([1, 3, 7], dtype=torch.int32)),
                              ValueError, r"cu_seqlens_q\[0\] must be 0"),
    "cu_seqlens decreasing": (dict(cu_seqlens_q=torch.tensor([0, 5, 4], dtype=torch.int32)),
                              ValueError, "must be non-decreasing"),
    "total mismatch": (dict(cu_seqlens_q=torch.tensor([0, 3, 6], dtype=torch.int32)),
                       ValueError, r"cu_seqlens_q\[-1\] must equal the packed length 7"),
    "max_seqlen too small": (dict(max_seqlen_k=5), ValueError, "max_seqlen_k .5. is smaller"),
    "max_seqlen negative": (dict(max_seqlen_q=-1), ValueError, "max_seqlen_q must be >= 0"),
    "q 4-D": (dict(q=torch.zeros(1, 7, 2, 64).half()), ValueError, "q must have 3 dimensions"),
    "block_table short": (dict(k=torch.zeros(4, 2, 2, 64).half(), v=torch.zeros(4, 2, 2, 64).half(),
                               block_table=torch.zeros(2, 2, dtype=torch.int32)), ValueError,
                          "exceed block_table's capacity"),
    "block_table rows": (dict(k=torch.zeros(4, 4, 2, 64).half(), v=torch.zeros(4, 4, 2, 64).half(),
                              block_table=torch.zeros(3, 2, dtype=torch.int32)), ValueError,
                         "block_table must have one row per sequence"),
    "window bad": (dict(window_size=(-2, 0)), ValueError, r"window_size\[0\] must be >= -1"),
    "window not a pair": (dict(window_size=4), TypeError, "window_size must be a pair"),
    "softcap negative": (dict(softcap=-1.0), ValueError, "softcap must be"),
    "softcap bool": (dict(softcap=True), TypeError, "softcap must be a real number"),
    "alibi shape": (dict(alibi_slopes=torch.ones(3)), ValueError, "alibi_slopes must have shape"),
    "alibi dtype": (dict(alibi_slopes=torch.ones(2, dtype=torch.float64)), TypeError,
                    "alibi_slopes must be float32"),
}


@pytest.mark.parametrize("case", VARLEN_ERRORS)
def test_varlen_bad_input_is_named(case):
    changes, error, message = VARLEN_ERRORS[case]
    args = _varlen_args(**{k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v
                           for k, v in changes.items()})
    with pytest.raises(error, match=message):
        tileattn.attention_varlen(**args)


def test_attention_mask_arguments_are_checked():
    q, k, v, _ = make_inputs((1, 8, 8, 2, 2, 64, 64, False), torch.float16)
    with pytest.raises(ValueError, match=r"window_size\[1\] must be >= -1"):
        tileattn.attention(q, k, v, window_size=(0, -5))
    with pytest.raises(ValueError, match="alibi_slopes must have shape \\[2\\] or \\[1, 2\\]"):
        tileattn.attention(q, k, v, alibi_slopes=torch.ones(4, device=DEVICE))
    with pytest.raises(ValueError, match="softcap must be a finite number"):
        tileattn.attention(q, k, v, softcap=float("inf"))


def test_empty_batch_and_queries():
    q = torch.zeros(0, 2, 64, dtype=torch.float16, device=DEVICE)
    k = torch.zeros(5, 2, 64, dtype=torch.float16, device=DEVICE)
    cu_q = torch.tensor([0, 0], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 5], dtype=torch.int32, device=DEVICE)
    out, lse = tileattn.attention_varlen(q, k, k, cu_q, cu_k, 0, 5, return_lse=True)
    assert out.shape == (0, 2, 64) and lse.shape == (2, 0)


def test_bf16_queries_over_an_fp8_paged_cache_decode():
    """The common serving case: a 16-bit q reads an FP8 cache (descales per tensor), through
    the decode kernel; a prefill-sized call of the same mix is refused by name."""
    lengths_q, lengths_k = [1, 2, 1], [30, 17, 64]
    q, cu_q = _packed(lengths_q, 4, 64, torch.bfloat16, 11)
    k, cu_k = _packed(lengths_k, 2, 64, torch.bfloat16, 12)
    (k8, kd), (v8, vd) = (_quantize(x, E4M3) for x in (k, k * 0.5))
    q = q.bfloat16()
    k_cache, table = _paged(k8, cu_k, 16, 13)
    v_cache, _ = _paged(v8, cu_k, 16, 13)
    out = tileattn.attention_varlen(q, k_cache, v_cache, cu_q, cu_k, 2, 64, block_table=table,
                                    causal=True, k_descale=kd, v_descale=vd)
    ref, _ = attention_varlen_reference(q, k_cache, v_cache, cu_q, cu_k, block_table=table,
                                        causal=True, k_descale=kd, v_descale=vd)
    assert relative_error(out, ref) < TOLERANCES[torch.bfloat16]
    long_q = torch.zeros(40, 4, 64, dtype=torch.bfloat16, device=DEVICE)
    cu_long = torch.tensor([0, 20, 30, 40], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="runs the decode kernel only"):
        tileattn.attention_varlen(long_q, k_cache, v_cache, cu_long, cu_k, 20, 64,
                                  block_table=table, k_descale=kd, v_descale=vd)


def test_packed_k_major_v_copy_starts_sequences_aligned():
    lengths = [5, 0, 40, 1, 3, 17]
    v, cu = _packed(lengths, 2, 24, torch.float16, 7)
    copy = packed_k_major_copy(v, cu, max(lengths))
    width = packed_v_width(v.shape[0], len(lengths))
    assert copy.shape == (width, 2, 24) and copy.stride() == (1, 24 * width, width)
    previous_end = 0
    for b, n in enumerate(lengths):
        start = (int(cu[b]) + V_ALIGN.value * b + V_ALIGN.value - 1) // V_ALIGN.value * V_ALIGN.value
        assert start % V_ALIGN.value == 0 and start >= previous_end and start + n <= width
        assert torch.equal(copy[start:start + n], v[int(cu[b]):int(cu[b]) + n])
        previous_end = start + n


@pytest.mark.parametrize("mask", ["none", "causal", "window-softcap-alibi"])
def test_packed_fp8_runs_on_a_k_major_v_with_aligned_starts(mask, monkeypatch):
    """What sm89/sm90 run for packed FP8 (there V must be K-major): forced here, where the CPU
    would keep V row-major, so the interpreter runs the aligned-start loads."""
    copies = []
    real_copy = ops_attention.fp8.packed_k_major_copy
    monkeypatch.setattr(ops_attention, "v_needs_k_major",
                        lambda arch, dtype: dtype in (E4M3, torch.float8_e5m2))
    monkeypatch.setattr(ops_attention.fp8, "packed_k_major_copy",
                        lambda *args: copies.append(1) or real_copy(*args))
    lengths_q, lengths_k = VARLEN
    q, cu_q = _packed(lengths_q, 4, 64, E4M3, 1)
    k, cu_k = _packed(lengths_k, 2, 64, E4M3, 2)
    v, _ = _packed(lengths_k, 2, 128, E4M3, 3)
    (q, qd), (k, kd), (v, vd) = (_quantize(x, E4M3) for x in (q, k, v))
    kwargs = {"none": {}, "causal": dict(causal=True),
              "window-softcap-alibi": dict(causal=True, window_size=(8, -1), softcap=5.0,
                                           alibi_slopes=SLOPES)}[mask]
    out, lse = tileattn.attention_varlen(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                         q_descale=qd, k_descale=kd, v_descale=vd,
                                         return_lse=True, **kwargs)
    assert copies
    ref, ref_lse = attention_varlen_reference(q, k, v, cu_q, cu_k, q_descale=qd, k_descale=kd,
                                              v_descale=vd, **kwargs)
    assert_matches(out, lse, ref, ref_lse, E4M3)
