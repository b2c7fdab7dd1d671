"""paged_decode() on a real GPU: GQA 32/8 at D=128 and other head dims, long mixed-length
batches, page sizes 1/16/64, 16-bit and FP8 caches, FP8 q, windows and hooks, splits over
every SM, CUDA-graph capture + replay, and the plan-mismatch safety net under replay. Skipped
on machines without CUDA; run through the device tool:

    python -m pytest -q tests/gpu/test_decode_gpu.py
"""

import pytest
import torch

import tileattn
from tileattn.ops.decode import decode_plan, paged_decode
from tileattn.arch import FP8_DTYPES

from ..decode_hooks import keep_last_keys, softcap_then_alibi
from ..test_decode import assert_matches_reference, make_paged_inputs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
SEQ_LENS = [1, 4, 1000, 4097, 8192, 64, 0]


def inputs_for(seq_lens, q_len, **options):
    options.setdefault("num_q_heads", 32)
    options.setdefault("num_kv_heads", 8)
    options.setdefault("head_dim", 128)
    return make_paged_inputs(seq_lens, [q_len] * len(seq_lens), device="cuda", **options)


def plan_for(inputs, q_len, **options):
    q, k, v, _, seq_lens_k, _, _ = inputs
    return decode_plan(seq_lens_k, num_q_heads=q.shape[1], num_kv_heads=k.shape[2],
                                q_len=q_len, page_size=k.shape[1], head_dim=q.shape[2],
                                head_dim_v=v.shape[3], kv_dtype=k.dtype, **options)


def decode(inputs, plan, **options):
    q, k, v, block_table, seq_lens_k, cu_seqlens_q, descales = inputs
    plan.partial_out.fill_(float("nan"))
    plan.partial_lse.fill_(float("nan"))
    return paged_decode(q, k, v, block_table, seq_lens_k=seq_lens_k,
                                 cu_seqlens_q=cu_seqlens_q, plan=plan, return_lse=True,
                                 **descales, **options)


@pytest.mark.parametrize("q_dtype,kv_dtype,descales", [
    (torch.bfloat16, torch.bfloat16, None), (torch.bfloat16, E4M3, "head"),
    (torch.float16, E5M2, "tensor"), (E4M3, E4M3, "head")], ids=str)
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("q_len", [1, 4])
def test_real_sizes(q_len, page_size, q_dtype, kv_dtype, descales):
    inputs = inputs_for(SEQ_LENS, q_len, page_size=page_size, q_dtype=q_dtype,
                        kv_dtype=kv_dtype, descales=descales)
    plan = plan_for(inputs, q_len)
    out, lse = decode(inputs, plan, causal=True)
    assert_matches_reference(out, lse, inputs, causal=True)
    plan.check_errors()


@pytest.mark.parametrize("heads,head_dim,head_dim_v,q_len", [
    ((32, 8), 64, 64, 2), ((32, 8), 256, 256, 1), ((16, 2), 192, 128, 3), ((64, 1), 128, 128, 8),
    ((8, 8), 96, 96, 1)])
def test_head_dims_and_groups(heads, head_dim, head_dim_v, q_len):
    inputs = inputs_for([3000, 17, 513], q_len, num_q_heads=heads[0], num_kv_heads=heads[1],
                        head_dim=head_dim, head_dim_v=head_dim_v, q_dtype=torch.bfloat16)
    out, lse = decode(inputs, plan_for(inputs, q_len), causal=True)
    assert_matches_reference(out, lse, inputs, causal=True)


@pytest.mark.parametrize("window_size,causal", [((1000, 0), True), ((256, 64), False)])
def test_sliding_window(window_size, causal):
    inputs = inputs_for([9000, 700, 5], 2, page_size=16, q_dtype=torch.bfloat16)
    plan = plan_for(inputs, 2, window_size=window_size)
    out, lse = decode(inputs, plan, causal=causal, window_size=window_size)
    assert_matches_reference(out, lse, inputs, causal=causal, window_size=window_size)


def test_hooks():
    inputs = inputs_for([4000, 33, 1], 2, q_dtype=torch.bfloat16, kv_dtype=E4M3)
    slopes = torch.rand(3, 32, device="cuda") * 0.05
    plan = plan_for(inputs, 2)
    out, lse = decode(inputs, plan, causal=True, score_mod=softcap_then_alibi,
                      mod_args=(20.0, slopes, 32))
    assert_matches_reference(out, lse, inputs, causal=True, softcap=20.0, alibi_slopes=slopes)
    out, lse = decode(inputs, plan, causal=True, mask_mod=keep_last_keys, mod_args=(300,))
    assert_matches_reference(out, lse, inputs, causal=True, window_size=(300, 0))


def test_single_long_sequence_splits_across_sms():
    inputs = inputs_for([32768], 1, page_size=16, q_dtype=torch.bfloat16)
    plan = plan_for(inputs, 1)
    assert plan.num_slots > 1 and plan.num_work == plan.num_slots
    out, lse = decode(inputs, plan, causal=True)
    assert_matches_reference(out, lse, inputs, causal=True)


def test_a_batch_that_fills_the_chip_is_not_split():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    inputs = inputs_for([300] * sms, 1, page_size=16, q_dtype=torch.bfloat16)
    plan = plan_for(inputs, 1)
    assert plan.num_slots == 0 and plan.num_work == sms
    out, lse = decode(inputs, plan, causal=True)
    assert_matches_reference(out, lse, inputs, causal=True)


def test_without_plan_and_with_cumulative_key_counts():
    inputs = inputs_for([77, 2000, 5], 3, q_dtype=torch.float16)
    q, k, v, block_table, seq_lens_k, cu_seqlens_q, _ = inputs
    cu_seqlens_k = torch.cat([seq_lens_k.new_zeros(1), seq_lens_k.cumsum(0).int()])
    out, lse = paged_decode(q, k, v, block_table, cu_seqlens_k=cu_seqlens_k,
                                     cu_seqlens_q=cu_seqlens_q, causal=True, return_lse=True)
    assert_matches_reference(out, lse, inputs, causal=True)


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, E4M3], ids=str)
def test_cuda_graph_capture_replay_and_mismatch(kv_dtype):
    """A plan made once; paged_decode captured in a CUDA graph and replayed with new cache
    and query contents. Then the key counts change without a new plan: the replay must flag
    it (NaN outputs, check_errors raises), never return plausible wrong attention."""
    seq_lens = [2, 700, 5000, 33]
    inputs = inputs_for(seq_lens, 2, page_size=16, q_dtype=torch.bfloat16, kv_dtype=kv_dtype)
    q, k, v, block_table, seq_lens_k, cu_seqlens_q, descales = inputs
    plan = plan_for(inputs, 2)
    assert plan.num_slots > 0, "the graph must include the combine step"
    out = torch.empty(q.shape[0], 32, 128, dtype=torch.bfloat16, device="cuda")

    def call():
        return paged_decode(q, k, v, block_table, seq_lens_k=seq_lens_k,
                                     cu_seqlens_q=cu_seqlens_q, plan=plan, causal=True,
                                     out=out, return_lse=True, **descales)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()   # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = call()
    for seed in (1, 2):
        new = inputs_for(seq_lens, 2, page_size=16, q_dtype=torch.bfloat16, kv_dtype=kv_dtype,
                         seed=seed)
        for mine, theirs in zip(inputs[:4], new[:4]):
            mine.copy_(theirs)
        for name, descale in descales.items():
            descale.copy_(new[6][name])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_matches_reference(out, lse, inputs, causal=True)
    plan.check_errors()

    seq_lens_k.add_(1)   # the plan's lengths no longer hold
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isnan(out).all()
    with pytest.raises(ValueError, match="key counts"):
        plan.check_errors()
    with pytest.raises(ValueError, match="other key counts"):
        paged_decode(q, k, v, block_table, seq_lens_k=seq_lens_k,
                              cu_seqlens_q=cu_seqlens_q, plan=plan, validate=True, **descales)


def test_bad_page_id_is_clamped_and_flagged():
    inputs = inputs_for([100, 300], 1, page_size=16, q_dtype=torch.bfloat16)
    q, k, v, block_table, seq_lens_k, cu_seqlens_q, _ = inputs
    plan = plan_for(inputs, 1)
    block_table[1, 3] = 1 << 30
    out = paged_decode(q, k, v, block_table, seq_lens_k=seq_lens_k,
                                cu_seqlens_q=cu_seqlens_q, plan=plan)
    torch.cuda.synchronize()
    assert torch.isfinite(out[0]).all() and torch.isnan(out[1]).all()
    with pytest.raises(ValueError, match="page id outside the cache"):
        plan.check_errors()


def test_fp8_q_output_dtype():
    inputs = inputs_for([500, 9], 1, q_dtype=E4M3, kv_dtype=E4M3, descales="tensor")
    out, lse = decode(inputs, plan_for(inputs, 1), causal=True)
    assert out.dtype == torch.bfloat16 and inputs[0].dtype in FP8_DTYPES
    assert_matches_reference(out, lse, inputs, causal=True)
