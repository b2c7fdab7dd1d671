"""mla_decode() on a real GPU: bf16 on the compiled kernels, real head counts, long
mixed-length batches, FP8 caches, both schedules, both partial kernels (Triton everywhere, Gluon
on sm90), and CUDA-graph capture + replay. Skipped on machines without CUDA; run through the
device tool.

Tiers (tests/conftest.py): the default run is the fast tier, which runs each partial kernel
(Triton 64-row wgmma and <=32-row mma.sync rows, split_dv and dup_qk, Gluon 16-bit and e4m3),
each cache dtype, page sizes 1/16/64, q_len > 1 and each feature test once; `pytest --full` adds
the rest of the grid (marked `full`).
"""

import pytest
import torch

import tileattn
from tileattn.reference import mla_decode_reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
full = pytest.mark.full

# Relative L2 error bound against the fp64 reference on the same (quantized) cache. bf16 output
# rounding alone is ~4e-3; P is rounded to bf16 before P@V. An FP8 cache is exact once widened
# (the reference reads the same e4m3 values), so it shares q's bound.
TOLERANCE = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3}
LSE_TOLERANCE = 1e-3
SCALE = 1.0 / 192 ** 0.5


def make_inputs(seq_lens, num_heads, q_len, page_size, q_dtype, kv_dtype, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    batch = len(seq_lens)
    max_pages = max(-(-s // page_size) for s in seq_lens) + 2
    num_pages = batch * max_pages + 5
    kv = torch.randn(num_pages, page_size, 576, device="cuda", generator=gen)
    page_table = torch.randperm(num_pages, device="cuda", generator=gen)[: batch * max_pages]
    page_table = page_table.reshape(batch, max_pages).to(torch.int32)
    q = torch.randn(batch, q_len, num_heads, 576, device="cuda", generator=gen).to(q_dtype)
    descale = None
    if kv_dtype == torch.float8_e4m3fn:
        descale = torch.tensor(0.02, device="cuda")   # randn / 0.02 stays inside e4m3's ±448
        kv = (kv / descale).to(kv_dtype)
    else:
        kv = kv.to(kv_dtype)
    return q, kv, page_table, torch.tensor(seq_lens, dtype=torch.int32, device="cuda"), descale


def check(out, lse, q, kv, page_table, seq_lens, descale):
    ref, ref_lse = mla_decode_reference(q, kv, page_table, seq_lens, softmax_scale=SCALE,
                                        kv_descale=descale)
    assert torch.isfinite(out).all()
    error = float((out.double() - ref).norm() / ref.norm())
    assert error < TOLERANCE[q.dtype], error
    assert float(((lse.double() - ref_lse).abs() / ref_lse.abs().clamp(min=1)).max()) < LSE_TOLERANCE


SEQ_LENS = [1, 4, 1000, 4097, 8192, 64]


# The fast tier of test_real_sizes: (num_heads, q_len, page_size, kv_dtype, schedule). On sm90:
# 16 rows run the Triton mma.sync row, 128 rows at page 1 the Triton wgmma row, 64+ rows at
# pages of 64 the Gluon kernels (16-bit and e4m3), dup_qk the other schedule.
FAST_REAL_SIZES = [
    (16, 1, 64, torch.bfloat16, "split_dv"), (16, 1, 1, torch.float8_e4m3fn, "split_dv"),
    (128, 1, 1, torch.bfloat16, "split_dv"), (128, 1, 64, torch.bfloat16, "split_dv"),
    (128, 4, 64, torch.float8_e4m3fn, "split_dv"), (16, 4, 1, torch.bfloat16, "dup_qk"),
    (128, 1, 64, torch.float8_e4m3fn, "dup_qk"),
]


def _real_size_cases():
    for num_heads in (16, 128):
        for q_len in (1, 4):
            for page_size in (1, 64):
                for kv_dtype in (torch.bfloat16, torch.float8_e4m3fn):
                    for schedule in ("split_dv", "dup_qk"):
                        case = (num_heads, q_len, page_size, kv_dtype, schedule)
                        yield pytest.param(*case, marks=() if case in FAST_REAL_SIZES else (full,),
                                           id=f"H{num_heads}-q{q_len}-page{page_size}-"
                                              f"{str(kv_dtype).replace('torch.', '')}-{schedule}")


@pytest.mark.parametrize("num_heads,q_len,page_size,kv_dtype,schedule", list(_real_size_cases()))
def test_real_sizes(num_heads, q_len, page_size, kv_dtype, schedule):
    inputs = make_inputs([max(s, q_len) for s in SEQ_LENS], num_heads, q_len, page_size, torch.bfloat16, kv_dtype)
    q, kv, page_table, seq_lens, descale = inputs
    plan = tileattn.mla_plan(seq_lens, num_heads=num_heads, q_len=q_len, page_size=page_size,
                             kv_dtype=kv.dtype, device="cuda", schedule=schedule)
    out, lse = tileattn.mla_decode(q, kv, page_table, seq_lens, softmax_scale=SCALE,
                                   kv_descale=descale, plan=plan, return_lse=True)
    check(out, lse, *inputs)


@pytest.mark.parametrize("num_heads,q_len", [pytest.param(32, 2, marks=full), (64, 3)])
def test_fp16_and_odd_rows_without_plan(num_heads, q_len):
    inputs = make_inputs([5, 3000, 17], num_heads, q_len, 16, torch.float16, torch.float16)
    q, kv, page_table, seq_lens, descale = inputs
    out, lse = tileattn.mla_decode(q, kv, page_table, seq_lens, softmax_scale=SCALE,
                                   return_lse=True)
    check(out, lse, *inputs)


def test_single_long_sequence_splits_across_sms():
    inputs = make_inputs([32768], 16, 1, 64, torch.bfloat16, torch.bfloat16)
    q, kv, page_table, seq_lens, descale = inputs
    plan = tileattn.mla_plan(seq_lens, num_heads=16, page_size=64, kv_dtype=kv.dtype, device="cuda")
    # As many items as one combine pass merges (MAX_SPLITS_PER_SEQ), not one per SM.
    assert plan.num_work == plan.num_slots == 64
    out, lse = tileattn.mla_decode(q, kv, page_table, seq_lens, softmax_scale=SCALE, plan=plan,
                                   return_lse=True)
    check(out, lse, *inputs)


needs_sm90 = pytest.mark.skipif(not torch.cuda.is_available()
                                or torch.cuda.get_device_capability() != (9, 0),
                                reason="the Gluon MLA kernel is sm90 only")


@pytest.mark.parametrize("kv_dtype,page_size,kernel", [
    pytest.param(torch.bfloat16, 16, "triton", marks=full), (torch.float8_e4m3fn, 16, "triton"),
    pytest.param(torch.bfloat16, 64, "gluon", marks=needs_sm90)], ids=str)
def test_cuda_graph_capture_and_replay_with_new_data(kv_dtype, page_size, kernel):
    q, kv, page_table, seq_lens, descale = make_inputs([2, 700, 5000, 33], 64, 2, page_size,
                                                       torch.bfloat16, kv_dtype)
    plan = tileattn.mla_plan(seq_lens, num_heads=64, q_len=2, page_size=page_size,
                             kv_dtype=kv.dtype, device="cuda", kernel=kernel)
    assert plan.num_slots > 0, "the graph must include the combine step"
    assert plan.kernel == kernel
    call = lambda: tileattn.mla_decode(q, kv, page_table, seq_lens, softmax_scale=SCALE,
                                       kv_descale=descale, plan=plan, return_lse=True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()   # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = call()
    for seed in (1, 2):
        new = make_inputs([2, 700, 5000, 33], 64, 2, page_size, torch.bfloat16, kv_dtype,
                          seed=seed)
        q.copy_(new[0])
        kv.copy_(new[1])
        page_table.copy_(new[2])
        if descale is not None:
            descale.copy_(new[4] * seed)
        graph.replay()
        torch.cuda.synchronize()
        check(out, lse, q, kv, page_table, seq_lens, descale)


@pytest.mark.parametrize("num_heads,q_len", [(16, 1), pytest.param(16, 2, marks=full),
                                             pytest.param(32, 1, marks=full)])
def test_fp8_cache_with_q_past_fp16_range(num_heads, q_len):
    """The FP8 rows that run their MMAs in fp16 scale each q row down by a power of two: a q
    whose values pass 65504 must still give the reference's answer."""
    q, kv, page_table, seq_lens, descale = make_inputs([3, 700, 129], num_heads, q_len, 16,
                                                       torch.bfloat16, torch.float8_e4m3fn)
    q = (q.float() * 3e5).to(torch.bfloat16)
    scale = SCALE / 3e5
    out, lse = tileattn.mla_decode(q, kv, page_table, seq_lens, softmax_scale=scale,
                                   kv_descale=descale, return_lse=True)
    ref, ref_lse = mla_decode_reference(q, kv, page_table, seq_lens, softmax_scale=scale,
                                        kv_descale=descale)
    assert torch.isfinite(out).all()
    assert float((out.double() - ref).norm() / ref.norm()) < TOLERANCE[q.dtype]
    assert float(((lse.double() - ref_lse).abs() / ref_lse.abs().clamp(min=1)).max()) < LSE_TOLERANCE


# ---- the Gluon sm90 kernels (kernels/mla/sm90.py, sm90_fp8.py), asked for by the plan ----

# The fast tier of test_gluon_kernel: (num_heads, q_len, dtype, kv_dtype or None for q's).
# 64 rows, 2+ row blocks (the L2 prefetch path), 32 and 96 rows (padded blocks), both caches.
FAST_GLUON = [(64, 1, torch.bfloat16, None), (128, 2, torch.float16, None),
              (64, 2, torch.bfloat16, torch.float8_e4m3fn), (32, 3, torch.float16, torch.float8_e4m3fn)]


def _gluon_cases():
    for num_heads, q_len in ((64, 1), (128, 1), (64, 2), (128, 2), (16, 4), (32, 3), (32, 1)):
        for dtype in (torch.bfloat16, torch.float16):
            for kv_dtype in (None, torch.float8_e4m3fn):
                case = (num_heads, q_len, dtype, kv_dtype)
                yield pytest.param(*case, marks=() if case in FAST_GLUON else (full,),
                                   id=f"H{num_heads}-q{q_len}-{str(dtype).replace('torch.', '')}-"
                                      f"kv={'e4m3' if kv_dtype else 'q'}")


@needs_sm90
@pytest.mark.parametrize("num_heads,q_len,dtype,kv_dtype", list(_gluon_cases()))
def test_gluon_kernel(num_heads, q_len, dtype, kv_dtype):
    """The 16-bit cache runs kernels/mla/sm90.py's kernel, the e4m3 cache sm90_fp8.py's."""
    inputs = make_inputs([max(s, q_len) for s in SEQ_LENS], num_heads, q_len, 64, dtype,
                         kv_dtype or dtype)
    q, kv, page_table, seq_lens, descale = inputs
    plan = tileattn.mla_plan(seq_lens, num_heads=num_heads, q_len=q_len, page_size=64,
                             kv_dtype=kv.dtype, device="cuda", kernel="gluon")
    assert plan.kernel == "gluon"
    assert plan.num_slots > 0, "some sequences must be split across work items"
    out, lse = tileattn.mla_decode(q, kv, page_table, seq_lens, softmax_scale=SCALE, plan=plan,
                                   kv_descale=descale, return_lse=True)
    check(out, lse, *inputs)


@needs_sm90
@pytest.mark.parametrize("num_heads,kv_dtype", [
    (64, torch.bfloat16), pytest.param(128, torch.bfloat16, marks=full),
    pytest.param(64, torch.float8_e4m3fn, marks=full), (128, torch.float8_e4m3fn)], ids=str)
def test_gluon_kernel_ignores_nan_past_sequence_end(num_heads, kv_dtype):
    """The last tile of a sequence is read whole by TMA; cache rows past seq_len (same page)
    hold NaN here and must not reach the output (the kernel zeroes them before P V)."""
    lengths = [1, 63, 65, 1000, 4097]
    q, kv, page_table, seq_lens, descale = make_inputs(lengths, num_heads, 1, 64, torch.bfloat16,
                                                       kv_dtype)
    for b, length in enumerate(lengths):
        page = int(page_table[b, length // 64])
        kv[page, length % 64:] = float("nan")
    plan = tileattn.mla_plan(seq_lens, num_heads=num_heads, page_size=64, kv_dtype=kv.dtype,
                             device="cuda", kernel="gluon")
    assert plan.kernel == "gluon"
    out, lse = tileattn.mla_decode(q, kv, page_table, seq_lens, softmax_scale=SCALE, plan=plan,
                                   kv_descale=descale, return_lse=True)
    check(out, lse, q, kv, page_table, seq_lens, descale)


@needs_sm90
def test_gluon_kernel_single_long_sequence():
    inputs = make_inputs([32768], 128, 1, 64, torch.bfloat16, torch.bfloat16)
    q, kv, page_table, seq_lens, descale = inputs
    plan = tileattn.mla_plan(seq_lens, num_heads=128, page_size=64, kv_dtype=kv.dtype,
                             device="cuda", kernel="gluon")
    assert plan.num_work > 32 and plan.kernel == "gluon"
    out, lse = tileattn.mla_decode(q, kv, page_table, seq_lens, softmax_scale=SCALE, plan=plan,
                                   return_lse=True)
    check(out, lse, *inputs)
