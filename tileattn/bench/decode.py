"""Paged GQA decode as the serving grid measures it (benchmarks/serving.py, case "decode") and
as the decode config sweep does (benchmarks/decode.py --sweep).

Shapes: GQA 32/8, D = Dv = 128, pages of 16 keys; a bf16 q over a bf16 cache or its e4m3 copy
(descales [] folded in). Every sequence of a point has the same key count; its pages are random
distinct pages of one large cache (a sequence's pages are not adjacent in memory). tileattn
runs through its kernel entry (tileattn.ops.decode.paged_decode, which takes the bf16 q with an
FP8 cache that attention_varlen's one-dtype rule refuses) with a decode_plan made outside the
timed region, as an engine makes it once per step for every layer. Timing: common.time_ms
eager, and triton.testing.do_bench_cudagraph replaying one captured call (as engines run
decode). Each call is first checked against the fp64 paged reference on its first two
sequences.

GB/s = (K and V bytes read + q read + out written + page ids read) / median time, beside the
HBM copy rate measured in the same run.
"""

from __future__ import annotations

import importlib.util

import torch

from .common import time_ms

NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE = 32, 8, 128, 16
CHECK_TOLERANCE = 2e-2   # relative L2 against fp64, bf16 output and P
FP8_DESCALE = 0.05       # the FP8 cache holds randn / 0.05, inside e4m3's +-448


def make_caches(points: list[dict], device, gen) -> dict:
    """dtype -> (k_cache, v_cache, descales): one bf16 cache pair with pages for the largest
    decode point, and its e4m3 copy (cache = bf16 / FP8_DESCALE) where a point needs it."""
    num_pages = max(p["batch"] * p["keys"] for p in points) // PAGE_SIZE
    shape = (num_pages, PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM)
    bf16 = [torch.randn(shape, device=device, dtype=torch.bfloat16, generator=gen)
            for _ in range(2)]
    caches = {"bf16": (*bf16, {})}
    if any(p["dtype"] == "fp8e4m3" for p in points):
        fp8 = [torch.empty(shape, device=device, dtype=torch.float8_e4m3fn) for _ in range(2)]
        for source, target in zip(bf16, fp8):
            step = 1 << 14   # slices of 1 GB in fp32: no cache-sized temporary
            for start in range(0, num_pages, step):
                target[start:start + step] = (source[start:start + step].float()
                                              / FP8_DESCALE).to(torch.float8_e4m3fn)
        descale = torch.tensor(FP8_DESCALE, device=device)
        caches["fp8e4m3"] = (*fp8, dict(k_descale=descale, v_descale=descale.clone()))
    return caches


def io_bytes(batch: int, keys: int, q_len: int, cache_dtype: torch.dtype) -> int:
    kv = batch * keys * NUM_KV_HEADS * 2 * HEAD_DIM * cache_dtype.itemsize
    q_and_out = 2 * batch * q_len * NUM_Q_HEADS * HEAD_DIM * 2
    return kv + q_and_out + batch * (keys // PAGE_SIZE) * 4


def make_inputs(point: dict, num_pages: int, device, gen):
    batch, keys, q_len = point["batch"], point["keys"], point["q_len"]
    pages = torch.randperm(num_pages, device=device, generator=gen)[:batch * keys // PAGE_SIZE]
    block_table = pages.to(torch.int32).reshape(batch, keys // PAGE_SIZE)
    q = torch.randn(batch * q_len, NUM_Q_HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16,
                    generator=gen)
    seq_lens = torch.full((batch,), keys, dtype=torch.int32, device=device)
    cu_seqlens_q = torch.arange(batch + 1, dtype=torch.int32, device=device) * q_len
    return q, block_table, seq_lens, cu_seqlens_q


def reference_error(out, q, k, v, block_table, seq_lens, cu_seqlens_q, descales, q_len) -> float:
    """Relative error of the first two sequences' outputs against the fp64 reference."""
    from tileattn.reference import paged_attention_reference
    count = min(2, block_table.shape[0])
    want, _ = paged_attention_reference(q[:count * q_len], k, v, block_table[:count],
                                        seq_lens[:count], cu_seqlens_q[:count + 1], causal=True,
                                        **descales)
    return float((out[:count * q_len].double() - want).norm() / want.norm())


def _timed(call, timings) -> dict:
    import triton
    return {timing: time_ms(call) if timing == "eager" else
            triton.testing.do_bench_cudagraph(call, rep=100, return_mode="median")
            for timing in timings}


def tileattn_rows(base, q, k, v, block_table, seq_lens, cu_seqlens_q, descales, q_len,
                  config=None, impl="tileattn", timings=("eager", "graph")) -> list[dict]:
    """Rows of paged_decode with a plan (config: a DecodeConfig replacing the table's row)."""
    from tileattn.ops.decode import decode_plan, paged_decode
    plan = decode_plan(seq_lens, num_q_heads=NUM_Q_HEADS, num_kv_heads=NUM_KV_HEADS,
                       q_len=q_len, page_size=PAGE_SIZE, head_dim=HEAD_DIM, kv_dtype=k.dtype,
                       config=config)
    out = torch.empty(q.shape[0], NUM_Q_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=q.device)

    def call():
        paged_decode(q, k, v, block_table, seq_lens_k=seq_lens, cu_seqlens_q=cu_seqlens_q,
                     plan=plan, causal=True, out=out, **descales)

    call()
    error = reference_error(out, q, k, v, block_table, seq_lens, cu_seqlens_q, descales, q_len)
    if not error < CHECK_TOLERANCE:
        raise AssertionError(f"{impl} is {error:.2e} from the reference at {base}")
    plan.check_errors()
    extra = dict(check_error=error, num_work=plan.num_work, num_slots=plan.num_slots,
                 block_n=plan.block_n, page_aligned=plan.page_aligned)
    return [dict(base, impl=impl, timing=timing, ms=ms, **extra)
            for timing, ms in _timed(call, timings).items()]


def flashinfer_rows(base, q, k, v, block_table, seq_lens, cu_seqlens_q, descales,
                    q_len) -> list[dict]:
    """FlashInfer's paged decode (q_len 1) or paged prefill (q_len > 1) on the same cache."""
    import flashinfer
    batch, pages_per_seq = block_table.shape
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=q.device)
    kv_indptr = torch.arange(batch + 1, dtype=torch.int32, device=q.device) * pages_per_seq
    last_page_len = (seq_lens - 1) % PAGE_SIZE + 1
    heads = (NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE)
    dtypes = dict(q_data_type=q.dtype, kv_data_type=k.dtype)
    if q_len == 1:
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
        wrapper.plan(kv_indptr, block_table.reshape(-1), last_page_len, *heads, **dtypes)
    else:
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        wrapper.plan(cu_seqlens_q, kv_indptr, block_table.reshape(-1), last_page_len, *heads,
                     causal=True, **dtypes)
    scales = {"k_scale": FP8_DESCALE, "v_scale": FP8_DESCALE} if descales else {}
    call = lambda: wrapper.run(q, (k, v), **scales)   # noqa: E731
    error = reference_error(call(), q, k, v, block_table, seq_lens, cu_seqlens_q, descales, q_len)
    if not error < CHECK_TOLERANCE:
        raise AssertionError(f"flashinfer is {error:.2e} from the reference at {base}")
    rows = [dict(base, impl="flashinfer", timing="eager", ms=time_ms(call), check_error=error)]
    try:   # its wrappers are not documented as graph-safe: a failure loses this row only
        rows += [dict(base, impl="flashinfer", timing="graph", ms=ms, check_error=error)
                 for ms in _timed(call, ("graph",)).values()]
    except Exception as failure:  # noqa: BLE001
        rows[0]["graph_error"] = f"{type(failure).__name__}: {str(failure)[:200]}"
    return rows


def measure(point, caches, copy_rate, device, gen, variants=None) -> list[dict]:
    """The rows of one point (dict: dtype of the cache, q_len, batch, keys) on caches from
    make_caches: tileattn eager and from a graph, and FlashInfer where it imports; or, with
    variants [(label, DecodeConfig)], each variant from a graph only (the config sweep). A call
    that fails or misses the reference gives a row with its error instead of timings."""
    k, v, descales = caches[point["dtype"]]
    q, block_table, seq_lens, cu_seqlens_q = make_inputs(point, k.shape[0], device, gen)
    inputs = (q, k, v, block_table, seq_lens, cu_seqlens_q, descales, point["q_len"])
    nbytes = io_bytes(point["batch"], point["keys"], point["q_len"], k.dtype)
    base = dict(point, bytes=nbytes, copy_gbps=copy_rate)
    if variants is not None:
        jobs = [(f"tileattn[{label}]", lambda config=config, label=label: tileattn_rows(
            base, *inputs, config=config, impl=f"tileattn[{label}]", timings=("graph",)))
            for label, config in variants]
    else:
        jobs = [("tileattn", lambda: tileattn_rows(base, *inputs))]
        if importlib.util.find_spec("flashinfer") is not None:
            jobs.append(("flashinfer", lambda: flashinfer_rows(base, *inputs)))
    rows = []
    for impl, job in jobs:
        try:
            rows += job()
        except Exception as error:  # noqa: BLE001 - recorded: a variant or peer that fails
            rows.append(dict(base, impl=impl, error=f"{type(error).__name__}: {str(error)[:200]}"))
    for row in rows:
        if "ms" in row:
            row["gbps"] = nbytes / row["ms"] / 1e6
            row["fraction_of_copy"] = row["gbps"] / copy_rate
    return rows
