"""mla_decode() against the fp64 reference (on CPU the real Triton kernels run in the
interpreter), and every bad input it must refuse.

q is fp16 or bf16 (bf16 runs on the CPU thanks to tileattn/interpreter_fixes.py), the cache q's
dtype or FP8; real head counts and long batches run in tests/gpu/test_mla_gpu.py.
"""

import dataclasses

import pytest
import torch

import tileattn
from tileattn.arch import arch_for_capability
from tileattn.kernels.runtime import interpreter_active
from tileattn.kernels.mla import decode as mla_kernels
from tileattn.reference import mla_decode_reference

# Relative L2 error bound against the fp64 reference on the same (quantized) cache, by q dtype.
# fp16: output rounding (~5e-4) plus P rounded to fp16 before P@V. An FP8 cache is compared
# with the reference on the same e4m3 values, which widen to fp16 exactly, so it shares fp16's
# bound; quantization error itself is not the kernel's.
TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
LSE_TOLERANCE = 1e-4
SCALE = 1.0 / 192 ** 0.5
E4M3 = torch.float8_e4m3fn

needs_kernels = pytest.mark.skipif(torch.cuda.is_available() or not interpreter_active(),
                                   reason="CPU interpreter tests (GPU runs tests/gpu)")


def make_inputs(seq_lens, num_heads=16, q_len=1, page_size=16, kv_dtype=torch.float16, seed=0,
                q_dtype=torch.float16):
    """Pages of each sequence scattered over the cache (a random permutation), plus unused
    page-table columns filled with an invalid id the kernel must never read."""
    gen = torch.Generator().manual_seed(seed)
    batch = len(seq_lens)
    used = [-(-s // page_size) for s in seq_lens]
    max_pages = max(used) + 1
    num_pages = sum(used) + 3
    kv = torch.randn(num_pages, page_size, 576, generator=gen)
    order = torch.randperm(num_pages, generator=gen)
    page_table = torch.full((batch, max_pages), 10**6, dtype=torch.int32)
    taken = 0
    for b, count in enumerate(used):
        page_table[b, :count] = order[taken:taken + count].to(torch.int32)
        taken += count
    q = torch.randn(batch, q_len, num_heads, 576, generator=gen).to(q_dtype)
    descale = None
    if kv_dtype == E4M3:
        descale = torch.tensor(0.25)
        kv = (kv / descale).to(E4M3)
    else:
        kv = kv.to(kv_dtype)
    return q, kv, page_table, torch.tensor(seq_lens, dtype=torch.int32), descale


def assert_matches_reference(out, lse, q, kv, page_table, seq_lens, descale):
    ref, ref_lse = mla_decode_reference(q, kv, page_table, seq_lens, softmax_scale=SCALE,
                                        kv_descale=descale)
    assert out.dtype == q.dtype and out.shape == (*q.shape[:3], 512)
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:3]
    assert torch.isfinite(out).all(), "output has NaN/inf"
    error = float((out.double() - ref).norm() / ref.norm())
    assert error < TOLERANCE[q.dtype], error
    assert float(((lse.double() - ref_lse).abs() / ref_lse.abs().clamp(min=1)).max()) < LSE_TOLERANCE


# (seq_lens, page_size, q_len): mixed lengths including 1 (needs q_len 1) and lengths that are
# not multiples of the tile, the page or the split chunk.
CASES = [
    ([1, 37, 100], 16, 1),
    ([1, 37, 100], 1, 1),
    ([2, 70, 129], 64, 2),
    ([4, 33, 100], 16, 4),
    ([3, 64, 200], 1, 3),
]


@needs_kernels
@pytest.mark.parametrize("schedule", ["split_dv", "dup_qk"])
@pytest.mark.parametrize("dtypes", [(torch.float16, torch.float16), (torch.float16, E4M3),
                                    (torch.bfloat16, torch.bfloat16), (torch.bfloat16, E4M3)],
                         ids=lambda d: f"q{str(d[0])[6:]}-kv{str(d[1])[6:]}")
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"p{c[1]}-q{c[2]}-{'_'.join(map(str, c[0]))}")
def test_matches_reference(case, dtypes, schedule):
    seq_lens, page_size, q_len = case
    q_dtype, kv_dtype = dtypes
    inputs = make_inputs(seq_lens, q_len=q_len, page_size=page_size, kv_dtype=kv_dtype,
                         q_dtype=q_dtype)
    q, kv, page_table, lens, descale = inputs
    plan = tileattn.mla_plan(lens, num_heads=16, q_len=q_len, page_size=page_size,
                             kv_dtype=kv.dtype, device="cpu", schedule=schedule)
    # Poison the workspace: every slot the combine reads must have been written this call.
    plan.partial_out.fill_(float("nan"))
    plan.partial_lse.fill_(float("nan"))
    out, lse = tileattn.mla_decode(q, kv, page_table, lens, softmax_scale=SCALE,
                                   kv_descale=descale, plan=plan, return_lse=True)
    assert_matches_reference(out, lse, *inputs)


@needs_kernels
def test_split_kv_and_combine_are_exercised():
    _, kv, _, lens, _ = make_inputs([1, 37, 100])
    plan = tileattn.mla_plan(lens, num_heads=16, page_size=16, kv_dtype=kv.dtype, device="cpu")
    assert plan.num_slots > 0 and plan.num_work > len(lens)


@needs_kernels
def test_without_plan_and_with_two_row_blocks():
    inputs = make_inputs([5, 90], num_heads=32, q_len=2, page_size=16)
    out, lse = tileattn.mla_decode(*inputs[:4], softmax_scale=SCALE, return_lse=True)
    assert_matches_reference(out, lse, *inputs)
    assert tileattn.mla_decode(*inputs[:4], softmax_scale=SCALE).shape == (2, 2, 32, 512)


@needs_kernels
def test_fp8_cache_without_descale_means_one():
    inputs = make_inputs([1, 50], kv_dtype=E4M3)
    q, kv, page_table, lens, _ = inputs
    out, lse = tileattn.mla_decode(q, kv, page_table, lens, softmax_scale=SCALE, return_lse=True)
    assert_matches_reference(out, lse, q, kv, page_table, lens, None)


@needs_kernels
def test_sm80_byte_decoding_of_fp8():
    """sm80 has no e4m3 type in Triton: its launch reads bytes and decodes them by hand. The
    interpreter runs that launch too (subnormals and negative values included)."""
    q, kv, page_table, lens, descale = make_inputs([3, 70], kv_dtype=E4M3)
    kv.view(torch.uint8)[0, 0, :16] = torch.arange(16, dtype=torch.uint8) | 0x80   # -subnormals
    kv.view(torch.uint8)[0, 1, :16] = torch.arange(16, dtype=torch.uint8)
    plan = tileattn.mla_plan(lens, num_heads=16, page_size=16, kv_dtype=kv.dtype, device="cpu")
    out = torch.empty(2, 1, 16, 512, dtype=q.dtype)
    lse = torch.empty(2, 1, 16)
    sm80 = arch_for_capability((8, 0))
    assert mla_kernels.kv_widen_mode(sm80, kv.dtype, q.dtype) == "bytes"
    for launch in mla_kernels.mla_decode_launches(q, kv, page_table, lens, descale, out, lse,
                                                  plan, SCALE, sm80):
        launch.run()
    assert_matches_reference(out, lse, q, kv, page_table, lens, descale)


@needs_kernels
@pytest.mark.parametrize("q_magnitude,v_chunks", [(1.0, 1), (3e5, 1), (1.0, 4)],
                         ids=["unit-q", "q-past-fp16-range", "v-in-4-chunks"])
def test_fp8_cache_with_fp16_mmas(q_magnitude, v_chunks):
    """The fp8_in_f16 knob runs the MMAs in fp16 for a bf16 q: rows of q past fp16's range
    (65504) must be scaled down exactly and their scores scaled back. fp8_v_chunks splits
    the re-read V and the accumulator into column chunks. (fp8_v_asm_rows, inline PTX, cannot
    run in the interpreter: the launch leaves it off here.)"""
    q, kv, page_table, lens, descale = make_inputs([3, 70, 129], q_len=2, kv_dtype=E4M3)
    q = (q.float() * q_magnitude).to(torch.bfloat16)
    q[0, 0, :4] /= q_magnitude   # rows of very different size in one block
    plan = tileattn.mla_plan(lens, num_heads=16, q_len=2, page_size=16, kv_dtype=kv.dtype,
                             device="cpu")
    # Both FP8 knobs, as sm90's small-block row ships them.
    plan = dataclasses.replace(plan, config=dataclasses.replace(
        plan.config, fp8_in_f16=True, fp8_reread_v=True, fp8_v_chunks=v_chunks,
        fp8_v_asm_rows=32))
    out = torch.empty(3, 2, 16, 512, dtype=q.dtype)
    lse = torch.empty(3, 2, 16)
    scale = SCALE / q_magnitude
    launches = mla_kernels.mla_decode_launches(q, kv, page_table, lens, descale, out, lse, plan,
                                               scale, arch_for_capability((9, 0)))
    assert launches[0].constexprs["FP8_IN_F16"] and not launches[0].constexprs["REUSE_KV_AS_V"]
    assert launches[0].constexprs["V_CHUNKS"] == v_chunks and not launches[0].constexprs["V_ASM"]
    for launch in launches:
        launch.run()
    ref, ref_lse = mla_decode_reference(q, kv, page_table, lens, softmax_scale=scale,
                                        kv_descale=descale)
    assert torch.isfinite(out).all(), "output has NaN/inf"
    error = float((out.double() - ref).norm() / ref.norm())
    assert error < TOLERANCE[torch.bfloat16], error
    assert float(((lse.double() - ref_lse).abs() / ref_lse.abs().clamp(min=1)).max()) < LSE_TOLERANCE


# ---- errors ---------------------------------------------------------------------------------

# Error cases run on the device the kernels run on (CPU tensors need the interpreter).
ERROR_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def good(**changes):
    q, kv, page_table, lens, _ = make_inputs([3, 20], page_size=16)
    args = dict(q=q, kv_cache=kv, page_table=page_table, seq_lens=lens, softmax_scale=SCALE)
    args.update(changes)
    return {name: value.to(ERROR_DEVICE) if isinstance(value, torch.Tensor)
            and value.device.type == "cpu" else value for name, value in args.items()}


def _call(args):
    args = dict(args)
    return tileattn.mla_decode(args.pop("q"), args.pop("kv_cache"), args.pop("page_table"),
                               args.pop("seq_lens"), **args)


def _bad_page():
    args = good()
    args["page_table"] = args["page_table"].clone()
    args["page_table"][1, 1] = args["kv_cache"].shape[0]
    return args


ERROR_CASES = {
    "q not a tensor": (lambda: good(q=[1.0]), TypeError, "q must be a torch.Tensor"),
    "q wrong rank": (lambda: good(q=good()["q"][0]), ValueError, "q must have 4 dimensions"),
    "q float32": (lambda: good(q=good()["q"].float()), TypeError, "q must be float16 or bfloat16"),
    "q last dim": (lambda: good(q=good()["q"][..., :512]), ValueError, "q's last dim must be 576"),
    "kv last dim": (lambda: good(kv_cache=good()["kv_cache"][..., :512]), ValueError,
                    "kv_cache's last dim must be 576"),
    "kv dtype differs from q": (lambda: good(kv_cache=good()["kv_cache"].bfloat16()), TypeError,
                                "kv_cache must have q's dtype"),
    "kv e5m2": (lambda: good(kv_cache=good()["kv_cache"].to(torch.float8_e5m2)), TypeError,
                "kv_cache must have q's dtype"),
    "page_table int64": (lambda: good(page_table=good()["page_table"].long()), TypeError,
                         "page_table must be int32"),
    "seq_lens int64": (lambda: good(seq_lens=good()["seq_lens"].long()), TypeError,
                       "seq_lens must be int32"),
    "seq_lens length": (lambda: good(seq_lens=torch.tensor([3], dtype=torch.int32)), ValueError,
                        "seq_lens must have one entry per sequence"),
    "page_table rows": (lambda: good(page_table=good()["page_table"][:1]), ValueError,
                        "page_table must have one row per sequence"),
    "heads not supported": (lambda: good(q=good()["q"][:, :, :8]), ValueError, r"q.s heads \(dim 2\) must be one of"),
    "q_len 5": (lambda: good(q=good()["q"].expand(2, 5, 16, 576).contiguous(),
                             seq_lens=torch.tensor([30, 30], dtype=torch.int32)),
                ValueError, "q_len (.dim 1. )?must be in 1..4"),
    "q_len > seq_len": (lambda: good(q=good()["q"].expand(2, 4, 16, 576).contiguous()),
                        ValueError, "must be >= q_len"),
    "seq_len over capacity": (lambda: good(seq_lens=torch.tensor([3, 49], dtype=torch.int32)),
                              ValueError, "exceed page_table's capacity"),
    "page id out of range": (_bad_page, ValueError, r"page_table\[1, 1\]"),
    "negative page id": (lambda: good(page_table=good()["page_table"] * 0 - 1), ValueError,
                         r"page_table\[0, 0\] = -1"),
    "q requires grad": (lambda: good(q=good()["q"].requires_grad_()), ValueError,
                        "q requires grad, but tileattn.mla_decode has no backward"),
    "descale with 16-bit cache": (lambda: good(kv_descale=torch.tensor(1.0)), ValueError,
                                  "kv_descale applies only to a float8_e4m3fn kv_cache"),
    "descale float64": (lambda: good(kv_cache=good()["kv_cache"].to(E4M3),
                                     kv_descale=torch.tensor(1.0, dtype=torch.float64)),
                        TypeError, "kv_descale must be float32"),
    "descale not scalar": (lambda: good(kv_cache=good()["kv_cache"].to(E4M3),
                                        kv_descale=torch.ones(2, 1)),
                           ValueError, "kv_descale must have shape \\[\\] \\(one scale for the whole cache\\), got \\(2, 1\\)"),
    "softmax_scale missing value": (lambda: good(softmax_scale=float("nan")), ValueError,
                                    "softmax_scale must be a positive finite number"),
    "q last dim strided": (lambda: good(q=torch.zeros(2, 1, 16, 1152, dtype=torch.float16,
                                                       device=ERROR_DEVICE)[..., ::2]),
                           ValueError, "q must have a contiguous last dim"),
    "plan for other batch": (lambda: good(plan=tileattn.mla_plan(
        torch.tensor([3], dtype=torch.int32), num_heads=16, page_size=16,
        kv_dtype=torch.float16, device=ERROR_DEVICE)), ValueError, "plan was made for"),
    "plan not a plan": (lambda: good(plan={}), TypeError, "plan must come from tileattn.mla_plan"),
}


@pytest.mark.parametrize("name", list(ERROR_CASES))
def test_bad_input_names_the_argument(name):
    make, error, message = ERROR_CASES[name]
    with pytest.raises(error, match=message):
        _call(make())


def test_tensors_on_different_devices():
    meta = good()
    meta["seq_lens"] = meta["seq_lens"].to("meta")
    with pytest.raises(ValueError, match="seq_lens is on meta"):
        _call(meta)


@needs_kernels
@pytest.mark.parametrize("bad_id", [10**5, 10**6, -1, "num_pages"])
def test_out_of_range_page_ids_raise_and_are_never_followed(bad_id):
    """With a plan (the README's path) an id outside the cache raises outside graph capture
    (the default); with validate=False, a captured graph's case, it is never followed."""
    q, kv, page_table, seq_lens, _ = make_inputs([40, 70])
    page_table[1, 2] = kv.shape[0] if bad_id == "num_pages" else bad_id
    plan = tileattn.mla_plan(seq_lens, num_heads=16, page_size=16, kv_dtype=kv.dtype,
                             device="cpu")
    args = dict(q=q, kv_cache=kv, page_table=page_table, seq_lens=seq_lens, plan=plan,
                softmax_scale=SCALE)
    with pytest.raises(ValueError, match=r"page_table\[1, 2\] = .* is not a page of kv_cache"):
        _call(args)
    if interpreter_active():
        out = _call(dict(args, validate=False))
        assert torch.isfinite(out).all()      # page 0 read instead: bounded, not foreign


@needs_kernels
@pytest.mark.parametrize("given", [[41, 71], [70, 40], [39, 69]],
                         ids=["next-step", "swapped", "shorter"])
def test_a_stale_plan_raises_or_gives_nan_never_a_wrong_answer(given):
    q, kv, page_table, _, _ = make_inputs([71, 71])
    plan = tileattn.mla_plan(torch.tensor([40, 70], dtype=torch.int32), num_heads=16,
                             page_size=16, kv_dtype=kv.dtype, device="cpu")
    seq_lens = torch.tensor(given, dtype=torch.int32)
    args = dict(q=q, kv_cache=kv, page_table=page_table, seq_lens=seq_lens, plan=plan,
                softmax_scale=SCALE)
    with pytest.raises(ValueError, match="plan was made for other seq_lens"):
        _call(args)
    if interpreter_active():
        out = _call(dict(args, validate=False))
        assert bool(out.isnan().all()), "every sequence's length differs: all rows NaN"


@pytest.mark.parametrize("kwargs,error,message", [
    (dict(num_heads=12), ValueError, "num_heads must be one of"),
    (dict(q_len=0), ValueError, "q_len (.dim 1. )?must be in 1..4"),
    (dict(page_size=0), ValueError, "page_size must be >= 1"),
    (dict(kv_dtype=torch.float32), TypeError, "kv_dtype must be"),
    (dict(schedule="fast"), ValueError, "schedule must be one of"),
    (dict(q_len=4), ValueError, "must be >= q_len"),
])
def test_plan_bad_input(kwargs, error, message):
    args = dict(num_heads=16, page_size=16, kv_dtype=torch.float16, device="cpu")
    args.update(kwargs)
    with pytest.raises(error, match=message):
        tileattn.mla_plan(torch.tensor([3, 20], dtype=torch.int32), **args)


def test_plan_refuses_more_work_items_than_one_launch_holds():
    seq_lens = torch.full((mla_kernels.MAX_WORK_ITEMS + 1,), 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="work items"):
        tileattn.mla_plan(seq_lens, num_heads=16, page_size=16, kv_dtype=torch.float16,
                          device="cpu")


def test_fp8_cache_slower_rule_names_the_measured_cliff():
    """mla_plan warns (PerformanceWarning) where an FP8 cache measured slower than bf16: sm90
    with H·q_len > 64 (docs/design.md has the measurements)."""
    from tileattn.arch import arch_for_capability
    from tileattn.dispatch import fp8_mla_cache_slower as fp8_cache_slower
    sm90, sm80, sm100 = (arch_for_capability(c) for c in ((9, 0), (8, 0), (10, 0)))
    assert fp8_cache_slower(sm90, 96) and fp8_cache_slower(sm90, 128)
    assert not fp8_cache_slower(sm90, 16) and not fp8_cache_slower(sm90, 32)
    assert not fp8_cache_slower(sm90, 64)
    assert not fp8_cache_slower(sm80, 128) and not fp8_cache_slower(sm100, 128)
