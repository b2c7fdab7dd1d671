"""paged_decode() and decode_plan() against the fp64 reference (on CPU the real Triton kernels
run in the interpreter), the plan-mismatch safety net, and every bad input they must refuse.

Inputs are hostile on purpose: pages of each sequence scattered over the cache, unused
block-table columns holding ids that are not pages, cache rows past each sequence's end and
unused pages filled with NaN (a kernel that reads them, or multiplies them by a zero
probability, returns NaN), outputs and split-KV workspace poisoned with NaN before the call.
Real head counts and long sequences run in tests/gpu/test_decode_gpu.py.
"""

import pytest
import torch
import tileattn
from tileattn.ops.decode import decode_plan, paged_decode
from tileattn.scheduler import decode as split_kv
from tileattn.arch import FP8_DTYPES, arch_for_capability
from tileattn.kernels.attention import decode as decode_kernels
from tileattn.kernels.runtime import interpreter_active
from tileattn.reference import paged_attention_reference

from .conftest import LSE_TOLERANCES, TOLERANCES
from .decode_hooks import keep_last_keys, softcap_only, softcap_then_alibi

needs_kernels = pytest.mark.skipif(torch.cuda.is_available() or not interpreter_active(),
                                   reason="CPU interpreter tests (GPU runs tests/gpu)")
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
GARBAGE_PAGE_IDS = (10**6, -7)


def make_paged_inputs(seq_lens, q_lens, *, num_q_heads=4, num_kv_heads=2, head_dim=64,
                      head_dim_v=None, page_size=16, q_dtype=torch.float16, kv_dtype=None,
                      descales="tensor", device="cpu", seed=0):
    """(q, k_cache, v_cache, block_table, seq_lens_k, cu_seqlens_q, descales dict).

    FP8 tensors are quantized from random normal values with float32 descales: per tensor
    (shape []) or per head ([batch, heads], each sequence's pages scaled by its own)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    kv_dtype = kv_dtype or q_dtype
    head_dim_v = head_dim_v or head_dim
    batch = len(seq_lens)
    used = [-(-n // page_size) for n in seq_lens]
    max_pages = max(used) + 2
    num_pages = sum(used) + 3
    order = torch.randperm(num_pages, generator=gen, device=device)
    block_table = torch.tensor([GARBAGE_PAGE_IDS[(b + c) % 2] for b in range(batch)
                                for c in range(max_pages)], dtype=torch.int32,
                               device=device).reshape(batch, max_pages)
    k = torch.randn(num_pages, page_size, num_kv_heads, head_dim, generator=gen, device=device)
    v = torch.randn(num_pages, page_size, num_kv_heads, head_dim_v, generator=gen, device=device)
    q = torch.randn(sum(q_lens), num_q_heads, head_dim, generator=gen, device=device)
    descale = {}
    if kv_dtype in FP8_DTYPES:
        if descales == "head":
            k_descale = torch.rand(batch, num_kv_heads, generator=gen, device=device) + 0.5
            v_descale = torch.rand(batch, num_kv_heads, generator=gen, device=device) + 0.5
        else:
            k_descale = torch.tensor(0.7, device=device)
            v_descale = torch.tensor(1.3, device=device)
        descale.update(k_descale=k_descale, v_descale=v_descale)
    taken = 0
    poisoned = torch.ones(num_pages, page_size, dtype=torch.bool, device=device)
    for b, (length, count) in enumerate(zip(seq_lens, used)):
        pages = order[taken:taken + count]
        taken += count
        block_table[b, :count] = pages.to(torch.int32)
        rows = torch.arange(count * page_size, device=device) < length
        poisoned[pages] = ~rows.reshape(count, page_size)
        if kv_dtype in FP8_DTYPES and descales == "head":
            k[pages] /= k_descale[b][:, None]
            v[pages] /= v_descale[b][:, None]
    if kv_dtype in FP8_DTYPES and descales != "head":
        k, v = k / k_descale, v / v_descale
    k, v = k.to(kv_dtype), v.to(kv_dtype)
    # NaN bits written through an integer view (torch cannot masked_fill FP8).
    bits = {1: torch.uint8, 2: torch.int16}[k.element_size()]
    nan = torch.tensor(float("nan")).to(kv_dtype).view(bits).item()
    k.view(bits)[poisoned], v.view(bits)[poisoned] = nan, nan
    cu_seqlens_q = torch.tensor([0] + q_lens, device=device).cumsum(0).to(torch.int32)
    if q_dtype in FP8_DTYPES:
        q_descale = (torch.rand(batch, num_q_heads, generator=gen, device=device) + 0.5
                     if descales == "head" else torch.tensor(0.9, device=device))
        per_row = q_descale if q_descale.dim() == 0 else q_descale.repeat_interleave(
            torch.tensor(q_lens, device=device), dim=0)[:, :, None]
        q = q / per_row
        descale["q_descale"] = q_descale
    q = q.to(q_dtype)
    seq_lens_k = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    return q, k, v, block_table, seq_lens_k, cu_seqlens_q, descale


def compute_dtype(q_dtype):
    return decode_kernels.compute_dtype(q_dtype)


def assert_matches_reference(out, lse, inputs, **options):
    q, k, v, block_table, seq_lens_k, cu_seqlens_q, descales = inputs
    ref, ref_lse = paged_attention_reference(q, k, v, block_table, seq_lens_k, cu_seqlens_q,
                                             **descales, **options)
    assert out.shape == ref.shape and lse.shape == ref_lse.shape
    assert torch.isfinite(out).all(), "output has NaN/inf"
    dtype = compute_dtype(q.dtype)
    error = float((out.double() - ref).norm() / ref.norm().clamp(min=1e-30))
    assert error < TOLERANCES[dtype], error
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse)), "rows with no visible key differ"
    finite = torch.isfinite(ref_lse)
    lse_error = (lse.double() - ref_lse)[finite].abs() / ref_lse[finite].abs().clamp(min=1)
    assert lse_error.numel() == 0 or float(lse_error.max()) < LSE_TOLERANCES[dtype]


def run(inputs, plan=None, poison=True, **options):
    """paged_decode into a NaN-filled output, with a NaN-filled workspace."""
    q, k, v, block_table, seq_lens_k, cu_seqlens_q, descales = inputs
    options.setdefault("cu_seqlens_q", cu_seqlens_q)
    if plan is None:
        q_lens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).tolist()
        plan = decode_plan(seq_lens_k, num_q_heads=q.shape[1], num_kv_heads=k.shape[2],
                                    q_len=max(max(q_lens), 1), page_size=k.shape[1],
                                    head_dim=q.shape[2], head_dim_v=v.shape[3],
                                    kv_dtype=k.dtype, window_size=options.get("window_size",
                                                                              (-1, -1)))
    if poison:
        plan.partial_out.fill_(float("nan"))
        plan.partial_lse.fill_(float("nan"))
    out_dtype = torch.bfloat16 if q.dtype in FP8_DTYPES else q.dtype
    out = torch.full((q.shape[0], q.shape[1], v.shape[3]), float("nan"), dtype=out_dtype)
    result = paged_decode(q, k, v, block_table, seq_lens_k=seq_lens_k, plan=plan,
                                   out=out, return_lse=True, **descales, **options)
    assert result[0] is out
    return result, plan


# ---- against the reference ------------------------------------------------------------------

# (seq_lens, q_lens, page_size, (num_q_heads, num_kv_heads), causal): empty and one-key
# sequences, a sequence with no queries, lengths off every tile, page and chunk size.
CASES = [
    ([37, 1, 100, 0], [1, 1, 1, 1], 16, (4, 2), True),
    ([37, 1, 100, 0], [1, 1, 1, 1], 1, (8, 1), False),
    ([3, 50, 129], [3, 3, 3], 1, (4, 2), True),
    ([70, 2, 129], [3, 0, 2], 64, (8, 1), True),
    ([33, 90], [3, 1], 16, (8, 1), False),
    ([160], [3], 16, (4, 1), True),     # one sequence: split over every SM, then combined
]


@needs_kernels
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"p{c[2]}-h{c[3][0]}_{c[3][1]}-"
                         f"{'causal' if c[4] else 'full'}-{'_'.join(map(str, c[0]))}")
def test_matches_reference(case):
    seq_lens, q_lens, page_size, (num_q_heads, num_kv_heads), causal = case
    inputs = make_paged_inputs(seq_lens, q_lens, num_q_heads=num_q_heads,
                               num_kv_heads=num_kv_heads, page_size=page_size)
    (out, lse), plan = run(inputs, causal=causal)
    assert_matches_reference(out, lse, inputs, causal=causal)
    plan.check_errors()


@needs_kernels
@pytest.mark.parametrize("page_size", [8, 16])
def test_tiles_spanning_several_pages(page_size):
    """The GPU rows' choice for small pages: 32-key tiles whose rows each find their page."""
    inputs = make_paged_inputs([45, 100, 2], [2, 1, 2], page_size=page_size)
    q, k, v, _, seq_lens_k, _, _ = inputs
    config = decode_kernels.DecodeConfig(32, 4, 1, 32, inflight_kb_per_sm=1,
                                         gather_small_pages=True)
    plan = decode_plan(seq_lens_k, num_q_heads=4, num_kv_heads=2, q_len=2,
                                page_size=page_size, head_dim=64, kv_dtype=k.dtype,
                                config=config)
    assert (plan.block_n, plan.page_aligned) == (32, False) and plan.num_slots > 0
    (out, lse), _ = run(inputs, plan=plan, causal=True)
    assert_matches_reference(out, lse, inputs, causal=True)


@needs_kernels
@pytest.mark.parametrize("q_dtype,kv_dtype,descales", [
    (torch.bfloat16, torch.bfloat16, None), (torch.bfloat16, E4M3, "head"),
    (torch.float16, E5M2, "tensor"), (E4M3, E4M3, "head"), (E5M2, E4M3, "tensor")],
    ids=lambda x: str(x).replace("torch.", ""))
def test_dtypes_and_descales(q_dtype, kv_dtype, descales):
    inputs = make_paged_inputs([45, 1, 77], [2, 1, 2], q_dtype=q_dtype, kv_dtype=kv_dtype,
                               descales=descales, page_size=16)
    (out, lse), _ = run(inputs, causal=True)
    assert out.dtype == (torch.bfloat16 if q_dtype in FP8_DTYPES else q_dtype)
    assert_matches_reference(out, lse, inputs, causal=True)


@needs_kernels
@pytest.mark.parametrize("head_dim,head_dim_v", [(64, 128), (96, 64), (128, 256)])
def test_head_dims(head_dim, head_dim_v):
    inputs = make_paged_inputs([20, 61], [1, 2], head_dim=head_dim, head_dim_v=head_dim_v)
    (out, lse), _ = run(inputs, causal=True)
    assert_matches_reference(out, lse, inputs, causal=True)


@needs_kernels
@pytest.mark.parametrize("window_size,causal,page_size", [
    ((20, -1), True, 16), ((7, 5), False, 1), ((0, 0), False, 64), ((-1, 3), False, 16)])
def test_sliding_window(window_size, causal, page_size):
    inputs = make_paged_inputs([90, 5, 131], [3, 2, 1], num_q_heads=8, num_kv_heads=2,
                               page_size=page_size)
    (out, lse), plan = run(inputs, causal=causal, window_size=window_size)
    assert_matches_reference(out, lse, inputs, causal=causal, window_size=window_size)
    if window_size[0] >= 0:   # the plan reads only the window's keys of the long sequence
        assert min(start for b, start, _, _ in plan.work.tolist() if b == 2) > 0


@needs_kernels
@pytest.mark.parametrize("per_batch_slopes", [False, True])
def test_softcap_and_alibi_hooks(per_batch_slopes):
    inputs = make_paged_inputs([40, 77, 3], [2, 1, 2], num_q_heads=8, num_kv_heads=2)
    gen = torch.Generator().manual_seed(1)
    slopes = torch.rand((3, 8) if per_batch_slopes else (8,), generator=gen) * 0.3
    q = inputs[0]
    inputs = (q * 4,) + inputs[1:]   # large scores, so the cap bends them
    (out, lse), _ = run(inputs, causal=True, score_mod=softcap_then_alibi,
                        mod_args=(5.0, slopes, 8 if per_batch_slopes else 0))
    assert_matches_reference(out, lse, inputs, causal=True, softcap=5.0, alibi_slopes=slopes)


@needs_kernels
def test_score_hook_on_a_split_sequence_with_fp8():
    inputs = make_paged_inputs([150], [2], num_q_heads=4, num_kv_heads=1, kv_dtype=E4M3,
                               q_dtype=torch.bfloat16)
    (out, lse), plan = run(inputs, causal=True, score_mod=softcap_only, mod_args=(2.0,))
    assert plan.num_slots > 1
    assert_matches_reference(out, lse, inputs, causal=True, softcap=2.0)


@needs_kernels
def test_mask_hook():
    inputs = make_paged_inputs([60, 33], [3, 1], num_q_heads=4, num_kv_heads=2)
    (out, lse), _ = run(inputs, causal=True, mask_mod=keep_last_keys, mod_args=(9,))
    assert_matches_reference(out, lse, inputs, causal=True, window_size=(9, 0))


@needs_kernels
def test_uniform_queries_without_cu_seqlens_q_and_cumulative_key_counts():
    """q rows b * q_len onwards (the plan's uniform offsets); keys from cu_seqlens_k."""
    inputs = make_paged_inputs([30, 65, 2], [2, 2, 2])
    q, k, v, block_table, seq_lens_k, cu_seqlens_q, _ = inputs
    cu_seqlens_k = torch.cat([torch.zeros(1, dtype=torch.int32), seq_lens_k.cumsum(0).int()])
    plan = decode_plan(cu_seqlens_k=cu_seqlens_k, num_q_heads=4, num_kv_heads=2,
                                q_len=2, page_size=16, head_dim=64, kv_dtype=k.dtype)
    out, lse = paged_decode(q, k, v, block_table, cu_seqlens_k=cu_seqlens_k, plan=plan,
                                     causal=True, return_lse=True)
    assert_matches_reference(out, lse, inputs, causal=True)


@needs_kernels
def test_sm80_decodes_fp8_bytes_by_hand():
    """sm80 has no e4m3 type in Triton: its launch reads bytes and widens them by hand (an FP8
    q as well). The interpreter runs that launch too."""
    inputs = make_paged_inputs([40, 19], [1, 2], q_dtype=E4M3, kv_dtype=E4M3, descales="head")
    q, k, v, block_table, seq_lens_k, cu_seqlens_q, descales = inputs
    plan = decode_plan(seq_lens_k, num_q_heads=4, num_kv_heads=2, q_len=2,
                                page_size=16, head_dim=64, kv_dtype=E4M3)
    out = torch.full((3, 4, 64), float("nan"), dtype=torch.bfloat16)
    lse = torch.full((4, 3), float("nan"))
    launches = decode_kernels.decode_launches(
        q, k, v, block_table, seq_lens_k, False, cu_seqlens_q, out, lse, plan,
        softmax_scale=0.125, window_left=-1, window_right=0, arch=arch_for_capability((8, 0)),
        **descales)
    assert launches[0].constexprs["KV_WIDEN"] == "bytes" == launches[0].constexprs["Q_WIDEN"]
    for launch in launches:
        launch.run()
    assert_matches_reference(out, lse, inputs, causal=True)


# ---- the plan and what it was made for ------------------------------------------------------

def split_plan(seq_lens, *, num_sms=1000, programs_per_sm=1, min_chunk=16, block_n=16,
               q_len=1, num_kv_heads=2, window_left=-1):
    # 16-bit K and V tiles of block_n x 64 columns each: programs_per_sm of them in flight.
    tile_kb = block_n * 128 * 2 / 1024
    config = decode_kernels.DecodeConfig(block_n, 4, 1, min_chunk,
                                         inflight_kb_per_sm=int(programs_per_sm * tile_kb))
    return split_kv.make_decode_plan(
        seq_lens, num_q_heads=4 * num_kv_heads, num_kv_heads=num_kv_heads, q_len=q_len,
        page_size=16,
        head_dim=64, head_dim_v=64, kv_dtype=torch.float16, window_left=window_left,
        config=config, block_n=block_n, page_aligned=True, rows_per_program=16,
        arch=arch_for_capability((9, 0)), num_sms=num_sms, device="cpu")


PLAN_CASES = [[1], [0, 1, 37, 100], [8192], [8192] + [100] * 31, [1024] * 512,
              [5, 4097, 64, 0, 3000, 17]]


@pytest.mark.parametrize("seq_lens", PLAN_CASES, ids=lambda s: f"{len(s)}seqs-max{max(s)}")
@pytest.mark.parametrize("num_sms", [8, 132])
@pytest.mark.parametrize("window_left", [-1, 100])
def test_plan_covers_every_planned_key_once_in_whole_tiles(seq_lens, num_sms, window_left):
    plan = split_plan(seq_lens, num_sms=num_sms, programs_per_sm=2, min_chunk=256,
                      block_n=64, window_left=window_left)
    ranges = split_kv.planned_key_ranges(seq_lens, 1, window_left, 64)
    covered = [torch.zeros(n, dtype=torch.int32) for n in seq_lens]
    items = [0] * len(seq_lens)
    for batch, start, end, slot in plan.work.tolist():
        assert ranges[batch][0] <= start <= end <= seq_lens[batch] and start % 64 == 0
        assert end - start <= plan.chunk_size
        covered[batch][start:end] += 1
        items[batch] += 1
    for (start, _), counts in zip(ranges, covered):
        assert bool((counts[start:] == 1).all()) and bool((counts[:start] == 0).all())
    assert all(1 <= n <= split_kv.MAX_ITEMS_PER_SEQ for n in items), "at least one a sequence"
    slots = plan.batch_slots.tolist()
    assert [b - a for a, b in zip(slots, slots[1:])] == [n if n > 1 else 0 for n in items]
    assert sorted(s for *_, s in plan.work.tolist() if s >= 0) == list(range(plan.num_slots))


def test_programs_per_sm_follow_the_bytes_in_flight():
    config = decode_kernels.DecodeConfig(64, 4, 2, 256, inflight_kb_per_sm=64)   # 1 buffer
    sm90, sm89 = arch_for_capability((9, 0)), arch_for_capability((8, 9))
    per_sm = split_kv.programs_per_sm
    assert per_sm(config, sm90, 16, 64, 128, 128, 2) == 2      # 32 KB tiles
    assert per_sm(config, sm90, 16, 16, 128, 128, 2) == 8      # 8 KB tiles
    assert per_sm(config, sm90, 16, 16, 128, 128, 1) == 12     # 48 warps bound it
    assert per_sm(config, sm89, 16, 16, 128, 128, 1) == 8      # 99 KB of shared memory does
    assert per_sm(config, sm90, 16, 64, 256, 256, 2) == 1
    two_buffers = decode_kernels.DecodeConfig(64, 4, 3, 256, inflight_kb_per_sm=64)
    assert per_sm(two_buffers, sm90, 16, 16, 128, 128, 2) == 4


def test_split_only_where_the_batch_leaves_sms_idle():
    # 132 SMs x 2 programs: 33 sequences x 8 kv heads fill them; 32 x 8 do not quite, yet
    # splitting them in two would not shorten the step (2 waves of half-length items).
    assert split_plan([4096] * 40, num_sms=132, programs_per_sm=2, num_kv_heads=8).num_slots == 0
    assert split_plan([4096] * 32, num_sms=132, programs_per_sm=2, num_kv_heads=8).num_slots == 0
    one = split_plan([16384], num_sms=132, programs_per_sm=2, num_kv_heads=8, min_chunk=256)
    assert one.num_work == 32   # chunks of 512 keys: 496 would make 34 items
    assert max(e - s for _, s, e, _ in one.work.tolist()) == one.chunk_size
    # Never more items a sequence than one combine pass merges, nor shorter than min_chunk.
    huge = split_plan([1 << 20], num_sms=10**5, num_kv_heads=1, min_chunk=256)
    assert huge.num_work == split_kv.MAX_ITEMS_PER_SEQ
    short = split_plan([1000], num_sms=10**5, num_kv_heads=1, min_chunk=256)
    assert short.num_work == 4


def test_split_balances_a_sequence_just_over_a_chunk():
    work, _ = split_kv.split_work([(0, 1100)], 1024, 64)
    assert [(s, e) for _, s, e, _ in work] == [(0, 576), (576, 1100)]


def test_plan_records_what_it_was_made_for():
    plan = decode_plan([40, 70], num_q_heads=8, num_kv_heads=2, q_len=2, page_size=16,
                                head_dim=128, head_dim_v=64, kv_dtype=E4M3, device="cpu")
    assert (plan.batch, plan.num_q_heads, plan.num_kv_heads, plan.q_len, plan.page_size,
            plan.head_dim, plan.head_dim_v, plan.kv_dtype) == (2, 8, 2, 2, 16, 128, 64, E4M3)
    assert plan.kv_lens.tolist() == [40, 70] and plan.kv_lens_host == (40, 70)
    assert plan.cu_seqlens_q_uniform.tolist() == [0, 2, 4]
    assert plan.partial_out.shape[1:] == (2 * 8, 64) and plan.error_flags.tolist() == [0]


@needs_kernels
def test_key_counts_other_than_the_plans_give_nan_and_a_flag():
    """The MLA plan's old failure: a plan for [40, 70] run with [41, 71] returned plausible
    wrong results. Here the kernel compares the counts it is given (a device tensor, no host
    sync) with the plan's: NaN outputs, a flag that check_errors raises on, once."""
    inputs = make_paged_inputs([41, 71], [1, 1])
    plan = decode_plan([40, 70], num_q_heads=4, num_kv_heads=2, page_size=16,
                                head_dim=64, kv_dtype=torch.float16, device="cpu")
    lens = inputs[4]
    # On the CPU the counts are host tensors and compared before any launch.
    with pytest.raises(ValueError, match="other key counts"):
        run(inputs, plan=plan)
    # On a GPU they are not read on the host; the launches alone must catch it.
    q, k, v, block_table, _, cu_seqlens_q, _ = inputs
    out = torch.zeros(2, 4, 64, dtype=torch.float16)
    for launch in decode_kernels.decode_launches(
            q, k, v, block_table, lens, False, cu_seqlens_q, out, None, plan,
            softmax_scale=0.125, window_left=-1, window_right=-1, arch=arch_for_capability((9, 0))):
        launch.run()
    assert torch.isnan(out).all()
    with pytest.raises(ValueError, match="key counts"):
        plan.check_errors()
    plan.check_errors()   # cleared


@needs_kernels
def test_more_queries_than_the_plans_q_len_are_flagged_and_nan():
    inputs = make_paged_inputs([30, 50], [1, 3])
    q, k, v, block_table, lens, cu_seqlens_q, _ = inputs
    plan = decode_plan(lens, num_q_heads=4, num_kv_heads=2, q_len=2, page_size=16,
                                head_dim=64, kv_dtype=torch.float16)
    out = torch.zeros(4, 4, 64, dtype=torch.float16)
    for launch in decode_kernels.decode_launches(
            q, k, v, block_table, lens, False, cu_seqlens_q, out, None, plan,
            softmax_scale=0.125, window_left=-1, window_right=0, arch=arch_for_capability((9, 0))):
        launch.run()
    assert torch.isfinite(out[0]).all() and torch.isnan(out[1:]).all()   # the third query too
    with pytest.raises(ValueError, match="more than the plan's q_len=2"):
        plan.check_errors()


@needs_kernels
def test_page_ids_outside_the_cache_are_never_read():
    inputs = make_paged_inputs([30, 50], [1, 1])
    q, k, v, block_table, lens, cu_seqlens_q, _ = inputs
    plan = decode_plan(lens, num_q_heads=4, num_kv_heads=2, page_size=16,
                                head_dim=64, kv_dtype=torch.float16)
    block_table = block_table.clone()
    block_table[1, 1] = 1 << 30   # used by sequence 1 (keys 16..31)
    out = torch.zeros(2, 4, 64, dtype=torch.float16)
    for launch in decode_kernels.decode_launches(
            q, k, v, block_table, lens, False, cu_seqlens_q, out, None, plan,
            softmax_scale=0.125, window_left=-1, window_right=-1, arch=arch_for_capability((9, 0))):
        launch.run()   # the interpreter raises on an out-of-bounds read
    assert torch.isfinite(out[0]).all() and torch.isnan(out[1]).all()
    with pytest.raises(ValueError, match="page id outside the cache"):
        plan.check_errors()
    with pytest.raises(ValueError, match=r"block_table\[1, 1\] = 1073741824"):
        paged_decode(q, k, v, block_table, seq_lens_k=lens, cu_seqlens_q=cu_seqlens_q,
                              plan=plan, validate=True)


# ---- bad input ------------------------------------------------------------------------------

def good(**changes):
    q, k, v, block_table, lens, cu_seqlens_q, _ = make_paged_inputs([3, 20], [1, 1])
    args = dict(q=q, k_cache=k, v_cache=v, block_table=block_table, seq_lens_k=lens,
                cu_seqlens_q=cu_seqlens_q)
    args.update(changes)
    return args


def call(args):
    args = dict(args)
    return paged_decode(args.pop("q"), args.pop("k_cache"), args.pop("v_cache"),
                                 args.pop("block_table"), **args)


def plan_for(lens, **changes):
    options = dict(num_q_heads=4, num_kv_heads=2, page_size=16, head_dim=64,
                   kv_dtype=torch.float16, device="cpu")
    options.update(changes)
    return decode_plan(lens, **options)


def with_page(value):
    args = good()
    args["block_table"] = args["block_table"].clone()
    args["block_table"][1, 1] = value
    return args


ERROR_CASES = {
    "q not a tensor": (lambda: good(q=[1.0]), TypeError, "q must be a torch.Tensor"),
    "q rank": (lambda: good(q=good()["q"][None]), ValueError, "q must have 3 dimensions"),
    "q float32": (lambda: good(q=good()["q"].float()), TypeError, "q must be float16, bfloat16"),
    "k dtype differs": (lambda: good(k_cache=good()["k_cache"].bfloat16(),
                                     v_cache=good()["v_cache"].bfloat16()), TypeError,
                        "k_cache must have q's dtype"),
    "k and v dtypes differ": (lambda: good(v_cache=good()["v_cache"].to(E4M3)), TypeError,
                              "k_cache and v_cache must share one dtype"),
    "fp8 q, 16-bit cache": (lambda: good(q=good()["q"].to(E4M3)), TypeError,
                            "an FP8 q needs an FP8 cache"),
    "heads not a multiple": (lambda: good(q=good()["q"][:, :3]), ValueError,
                             "must be a multiple of the cache's heads"),
    "head dim differs": (lambda: good(q=good()["q"][..., :32]), ValueError,
                         "q and k_cache must have the same head_dim"),
    "head dim unsupported": (lambda: good(q=good()["q"][..., :48],
                                          k_cache=good()["k_cache"][..., :48]),
                             ValueError, "q/k head_dim must be one of"),
    "v pages differ": (lambda: good(v_cache=good()["v_cache"][:-1]), ValueError,
                       "v_cache must have k_cache's pages"),
    "q last dim strided": (lambda: good(q=torch.zeros(2, 4, 128, dtype=torch.float16)[..., ::2]),
                           ValueError, "q must have a contiguous last dim"),
    "block_table int64": (lambda: good(block_table=good()["block_table"].long()), TypeError,
                          "block_table must be int32"),
    "no key counts": (lambda: good(seq_lens_k=None), ValueError, "exactly one of seq_lens_k"),
    "both key counts": (lambda: good(cu_seqlens_k=torch.tensor([0, 3, 23], dtype=torch.int32)),
                        ValueError, "exactly one of seq_lens_k"),
    "seq_lens_k int64": (lambda: good(seq_lens_k=good()["seq_lens_k"].long()), TypeError,
                         "seq_lens_k must be int32"),
    "seq_lens_k length": (lambda: good(seq_lens_k=torch.tensor([3], dtype=torch.int32)),
                          ValueError, "seq_lens_k gives 1 sequences but block_table has 2"),
    "negative key count": (lambda: good(seq_lens_k=torch.tensor([3, -1], dtype=torch.int32)),
                           ValueError, "key counts >= 0"),
    "keys past the table": (lambda: good(seq_lens_k=torch.tensor([3, 200], dtype=torch.int32)),
                            ValueError, "past block_table's capacity"),
    "cu_seqlens_q entries": (lambda: good(cu_seqlens_q=torch.tensor([0, 1], dtype=torch.int32)),
                             ValueError, "cu_seqlens_q must have batch \\+ 1 = 3 entries"),
    "page id too large": (lambda: with_page(10**6), ValueError, r"block_table\[1, 1\] = 1000000"),
    "page id negative": (lambda: with_page(-1), ValueError, r"block_table\[1, 1\] = -1"),
    "q descale with fp16": (lambda: good(q_descale=torch.tensor(1.0)), ValueError,
                            "q_descale applies only to an FP8 q"),
    "k descale with fp16": (lambda: good(k_descale=torch.tensor(1.0)), ValueError,
                            "k_descale/v_descale apply only to an FP8 cache"),
    "descale shape": (lambda: good(k_cache=good()["k_cache"].to(E4M3),
                                   v_cache=good()["v_cache"].to(E4M3),
                                   k_descale=torch.ones(2, 4)), ValueError,
                      r"k_descale must have shape \[\] \(per tensor\) or \[2, 2\]"),
    "causal not bool": (lambda: good(causal=1), TypeError, "causal must be a bool"),
    "softmax_scale nan": (lambda: good(softmax_scale=float("nan")), ValueError,
                          "softmax_scale must be a positive finite"),
    "window not a pair": (lambda: good(window_size=5), ValueError, "window_size must be a pair"),
    "window below -1": (lambda: good(window_size=(-2, 0)), ValueError,
                        "window_size must be a pair"),
    "score_mod python": (lambda: good(score_mod=lambda s: s), TypeError,
                         "score_mod must be a @triton.jit function"),
    "mod_args list": (lambda: good(mod_args=[1.0]), TypeError, "mod_args must be a tuple"),
    "out shape": (lambda: good(out=torch.empty(2, 4, 32, dtype=torch.float16)), ValueError,
                  r"out must have shape \(2, 4, 64\)"),
    "out_dtype int": (lambda: good(out_dtype=torch.int32), TypeError, "out_dtype must be"),
    "q requires grad": (lambda: good(q=good()["q"].requires_grad_()), ValueError,
                        "q requires grad, but tileattn.attention_varlen has no backward"),
    "plan not a plan": (lambda: good(plan={}), TypeError,
                        "plan must come from tileattn.decode_plan"),
    "plan for other heads": (lambda: good(plan=plan_for([3, 20], num_q_heads=8)), ValueError,
                             "plan was made for .* = \\(2, 8, 2,"),
    "plan for other batch": (lambda: good(plan=plan_for([3])), ValueError, "plan was made for"),
    "plan for other dtype": (lambda: good(plan=plan_for([3, 20], kv_dtype=E4M3)), ValueError,
                             "plan was made for"),
    "plan for other lengths": (lambda: good(plan=plan_for([3, 19])), ValueError,
                               "other key counts"),
    "plan for a smaller window": (lambda: good(plan=plan_for([3, 20], window_size=(4, 0)),
                                               window_size=(8, 0)), ValueError,
                                  "plan was made for window_size\\[0\\] = 4"),
    "too many queries for the plan": (lambda: good(
        q=torch.randn(3, 4, 64).half(), cu_seqlens_q=torch.tensor([0, 1, 3], dtype=torch.int32),
        plan=plan_for([3, 20])), ValueError, "q has 3 rows, more than batch x q_len = 2 x 1"),
    "cu_seqlens_q past q": (
        lambda: good(cu_seqlens_q=torch.tensor([0, 1, 3], dtype=torch.int32)), ValueError,
        "cu_seqlens_q must run from 0 to q's 2 rows"),
    "more queries than the plan's q_len": (lambda: good(
        q=torch.randn(2, 4, 64).half(), cu_seqlens_q=torch.tensor([0, 0, 2], dtype=torch.int32),
        plan=plan_for([3, 20])), ValueError, "sequence 1 2 queries; at most 1"),
    "no cu_seqlens_q, rows off the plan": (lambda: good(
        q=torch.randn(3, 4, 64).half(), cu_seqlens_q=None, plan=plan_for([3, 20])), ValueError,
        "without cu_seqlens_q, q must hold batch x q_len"),
}


@pytest.mark.parametrize("name", list(ERROR_CASES))
def test_bad_input_names_the_argument(name):
    make, error, message = ERROR_CASES[name]
    with pytest.raises(error, match=message):
        call(make())


def test_tensors_on_different_devices():
    with pytest.raises(ValueError, match="block_table is on meta"):
        call(good(block_table=good()["block_table"].to("meta")))


@pytest.mark.parametrize("changes,error,message", [
    (dict(num_kv_heads=3), ValueError, "must be a multiple of num_kv_heads"),
    (dict(q_len=0), ValueError, "q_len must be an int in 1..64"),
    (dict(page_size=0), ValueError, "page_size must be an int >= 1"),
    (dict(head_dim=80), ValueError, "head_dim must be one of"),
    (dict(kv_dtype=torch.float32), TypeError, "kv_dtype must be"),
    (dict(window_size=(1, 2, 3)), ValueError, "window_size must be a pair"),
    (dict(device=None), ValueError, "device is needed"),
])
def test_plan_bad_input(changes, error, message):
    with pytest.raises(error, match=message):
        plan_for([3, 20], **changes)


def test_plan_bad_key_counts():
    with pytest.raises(ValueError, match="key counts >= 0"):
        plan_for([3, -1])
    with pytest.raises(TypeError, match="seq_lens_k must be int32"):
        plan_for(torch.tensor([3, 1]))
    with pytest.raises(ValueError, match="cu_seqlens_k must start at 0"):
        decode_plan(cu_seqlens_k=[1, 3], num_q_heads=4, num_kv_heads=2, page_size=16,
                             head_dim=64, kv_dtype=torch.float16, device="cpu")
