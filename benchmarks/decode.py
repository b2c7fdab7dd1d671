"""Paged GQA decode, the serving grid of ../shared/BENCHMARKS.md: GB/s against the same run's
HBM copy rate, eager and replayed from a CUDA graph, with FlashInfer as a peer where it imports.

    python benchmarks/decode.py results.json              # the grid (~4-6 min on an H100)
    python benchmarks/decode.py results.json --quick      # four shapes
    python benchmarks/decode.py results.json --sweep      # config variants on a few shapes

Grid: q_len 1/2/4, GQA 32/8, D = Dv = 128, page 16, batch {1, 32, 128, 512} x keys {1024,
4096, 16384}, bf16 q with a bf16 or FP8 e4m3 cache (descales [] folded in), causal. Every
sequence of a shape has the same key count; pages are random distinct pages of one large
cache (a sequence's pages are not adjacent in memory). The plan is made outside the timed
region, as an engine makes it once per step for every layer.

GB/s = (K and V bytes read + q read + out written + page ids read) / median time. Each tileattn
shape is checked against the fp64 reference on its first two sequences before timing. Timing:
tileattn.bench.common.time_ms (do_bench warmup 100, rep 400, median) eager, and
triton.testing.do_bench_cudagraph replaying one captured call.

Rows: {"case": "decode", "impl", "timing": "eager"|"graph", "dtype" (cache), "q_len", "batch",
"keys", "ms", "gbps", "copy_gbps", "fraction_of_copy", ...}; --sweep rows name their variant
in "impl" (tileattn[variant]).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import pathlib
import sys
import time

import torch
import triton

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import tileattn  # noqa: E402
from tileattn.ops.decode import decode_plan, paged_decode  # noqa: E402
from tileattn.arch import arch_of  # noqa: E402
from tileattn.bench.common import copy_gbps, device_facts, spin_up, time_ms  # noqa: E402
from tileattn.kernels.attention import decode as decode_kernels  # noqa: E402
from tileattn.reference import paged_attention_reference  # noqa: E402

NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE = 32, 8, 128, 16
BATCHES, KEYS, Q_LENS = (1, 32, 128, 512), (1024, 4096, 16384), (1, 2, 4)
CACHE_DTYPES = {"bf16": torch.bfloat16, "fp8e4m3": torch.float8_e4m3fn}
# Relative L2 error of a timed output against the fp64 reference (bf16 output and P).
CHECK_TOLERANCE = 2e-2
FP8_DESCALE = 0.05   # the cache holds randn / 0.05, inside e4m3's +-448
HAVE_FLASHINFER = importlib.util.find_spec("flashinfer") is not None


def make_caches(device, gen):
    """One bf16 cache large enough for the biggest shape and its FP8 copy (K and V each)."""
    num_pages = max(BATCHES) * max(KEYS) // PAGE_SIZE
    shape = (num_pages, PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM)
    caches = {}
    bf16 = [torch.randn(shape, device=device, dtype=torch.bfloat16, generator=gen)
            for _ in range(2)]
    caches["bf16"] = (bf16[0], bf16[1], {})
    fp8 = [torch.empty(shape, device=device, dtype=torch.float8_e4m3fn) for _ in range(2)]
    for source, target in zip(bf16, fp8):
        step = 1 << 14   # in slices of 1 GB of fp32: no 70 GB temporary
        for start in range(0, num_pages, step):
            target[start:start + step] = (source[start:start + step].float()
                                          / FP8_DESCALE).to(torch.float8_e4m3fn)
    descale = torch.tensor(FP8_DESCALE, device=device)
    caches["fp8e4m3"] = (fp8[0], fp8[1], dict(k_descale=descale, v_descale=descale.clone()))
    return caches


def shape_inputs(batch, keys, q_len, num_pages, device, gen):
    pages_per_seq = keys // PAGE_SIZE
    block_table = torch.randperm(num_pages, device=device, generator=gen)[:batch * pages_per_seq]
    block_table = block_table.to(torch.int32).reshape(batch, pages_per_seq)
    q = torch.randn(batch * q_len, NUM_Q_HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16,
                    generator=gen)
    seq_lens = torch.full((batch,), keys, dtype=torch.int32, device=device)
    cu_seqlens_q = torch.arange(batch + 1, dtype=torch.int32, device=device) * q_len
    return q, block_table, seq_lens, cu_seqlens_q


def io_bytes(batch, keys, q_len, cache_dtype) -> int:
    kv = batch * keys * NUM_KV_HEADS * 2 * HEAD_DIM * cache_dtype.itemsize
    q_out = 2 * batch * q_len * NUM_Q_HEADS * HEAD_DIM * 2
    return kv + q_out + batch * (keys // PAGE_SIZE) * 4


def check(out, q, k, v, block_table, seq_lens, cu_seqlens_q, descales, q_len) -> float:
    """Relative error of the first two sequences' outputs against the fp64 reference."""
    count = min(2, block_table.shape[0])
    ref, _ = paged_attention_reference(q[:count * q_len], k, v, block_table[:count],
                                       seq_lens[:count], cu_seqlens_q[:count + 1], causal=True,
                                       **descales)
    got = out[:count * q_len].double()
    return float((got - ref).norm() / ref.norm())


def tileattn_rows(base, q, k, v, block_table, seq_lens, cu_seqlens_q, descales, q_len,
                  config=None, impl="tileattn", timings=("eager", "graph")):
    plan = decode_plan(seq_lens, num_q_heads=NUM_Q_HEADS, num_kv_heads=NUM_KV_HEADS,
                                q_len=q_len, page_size=PAGE_SIZE, head_dim=HEAD_DIM,
                                kv_dtype=k.dtype, config=config)
    out = torch.empty(q.shape[0], NUM_Q_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=q.device)

    def call():
        paged_decode(q, k, v, block_table, seq_lens_k=seq_lens,
                              cu_seqlens_q=cu_seqlens_q, plan=plan, causal=True, out=out,
                              **descales)

    call()
    error = check(out, q, k, v, block_table, seq_lens, cu_seqlens_q, descales, q_len)
    if not error < CHECK_TOLERANCE:
        raise AssertionError(f"{impl} differs from the reference by {error:.2e} at {base}")
    plan.check_errors()
    extra = dict(rel_error=error, num_work=plan.num_work, num_slots=plan.num_slots,
                 block_n=plan.block_n, page_aligned=plan.page_aligned)
    rows = []
    for timing in timings:
        ms = time_ms(call) if timing == "eager" else triton.testing.do_bench_cudagraph(
            call, rep=100, return_mode="median")
        rows.append(dict(base, impl=impl, timing=timing, ms=ms, **extra))
    return rows


def flashinfer_rows(base, q, k, v, block_table, seq_lens, cu_seqlens_q, descales, q_len):
    """FlashInfer's paged decode (q_len 1) or paged prefill (q_len > 1) on the same cache."""
    import flashinfer  # noqa: F401  (ImportError: the caller records the peer as missing)
    batch, pages_per_seq = block_table.shape
    device = q.device
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    kv_indptr = torch.arange(batch + 1, dtype=torch.int32, device=device) * pages_per_seq
    kv_indices = block_table.reshape(-1)
    last_page_len = (seq_lens - 1) % PAGE_SIZE + 1
    scales = ({"k_scale": FP8_DESCALE, "v_scale": FP8_DESCALE} if descales else {})
    if q_len == 1:
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
        wrapper.plan(kv_indptr, kv_indices, last_page_len, NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM,
                     PAGE_SIZE, q_data_type=q.dtype, kv_data_type=k.dtype)
    else:
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        wrapper.plan(cu_seqlens_q, kv_indptr, kv_indices, last_page_len, NUM_Q_HEADS,
                     NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE, causal=True, q_data_type=q.dtype,
                     kv_data_type=k.dtype)
    call = lambda: wrapper.run(q, (k, v), **scales)
    out = call()
    error = check(out, q, k, v, block_table, seq_lens, cu_seqlens_q, descales, q_len)
    if not error < CHECK_TOLERANCE:
        raise AssertionError(f"flashinfer differs from the reference by {error:.2e} at {base}")
    rows = [dict(base, impl="flashinfer", timing="eager", ms=time_ms(call), rel_error=error)]
    try:   # the plain wrappers are not documented as graph-safe: a failure loses one row only
        rows.append(dict(base, impl="flashinfer", timing="graph", rel_error=error,
                         ms=triton.testing.do_bench_cudagraph(call, rep=100,
                                                              return_mode="median")))
    except Exception as error:
        rows[0]["graph_error"] = f"{type(error).__name__}: {str(error)[:200]}"
    return rows


SWEEP_SHAPES = ((128, 4096, 1, "bf16"), (128, 4096, 1, "fp8e4m3"), (32, 4096, 1, "bf16"),
                (1, 16384, 1, "bf16"), (512, 1024, 4, "bf16"))
SWEEP_VARIANTS = (
    ("table", {}), ("page-tiles", {"gather_small_pages": False}),
    ("page-tiles-s4", {"gather_small_pages": False, "num_stages": 4}),
    ("N32", {"block_n": 32}), ("N128", {"block_n": 128}),
    ("s2", {"num_stages": 2}), ("s4", {"num_stages": 4}), ("w2", {"num_warps": 2}),
    ("w8", {"num_warps": 8}),
    ("inflight64", {"inflight_kb_per_sm": 64}), ("inflight256", {"inflight_kb_per_sm": 256}),
    ("chunk128", {"min_chunk": 128}), ("chunk1024", {"min_chunk": 1024}),
)


def run(path: pathlib.Path, quick: bool = False, sweep: bool = False, budget_s: float = 500.0,
        device: str = "cuda"):
    device = torch.device(device)
    facts = device_facts(device)
    gen = torch.Generator(device=device).manual_seed(0)
    spin_up()
    copy_rate = copy_gbps(device)
    caches = make_caches(device, gen)
    num_pages = caches["bf16"][0].shape[0]
    if sweep:
        grid = [(b, n, ql, name, variant) for b, n, ql, name in SWEEP_SHAPES
                for variant in SWEEP_VARIANTS]
    elif quick:
        grid = [(b, n, 1, name, None) for b, n in ((1, 16384), (128, 4096))
                for name in CACHE_DTYPES]
    else:
        grid = [(b, n, ql, name, None) for name in CACHE_DTYPES for ql in Q_LENS
                for b in BATCHES for n in KEYS]
    print(f"paged decode on {facts['device']}: {len(grid)} points, copy rate "
          f"{copy_rate:.0f} GB/s", flush=True)
    rows, skipped, started = [], [], time.time()
    if not HAVE_FLASHINFER and not sweep:
        skipped.append("flashinfer: not importable here (the peer is measured where it is)")
    base_config = decode_kernels.config_for(arch_of(device), HEAD_DIM, HEAD_DIM)
    for index, (batch, keys, q_len, name, variant) in enumerate(grid):
        if time.time() - started > budget_s:
            skipped += [f"{point[:4]} (over the {budget_s:.0f} s budget)" for point in grid[index:]]
            break
        k, v, descales = caches[name]
        q, block_table, seq_lens, cu_seqlens_q = shape_inputs(batch, keys, q_len, num_pages,
                                                              device, gen)
        nbytes = io_bytes(batch, keys, q_len, k.dtype)
        base = dict(case="decode", dtype=name, q_len=q_len, batch=batch, keys=keys,
                    heads=f"{NUM_Q_HEADS}/{NUM_KV_HEADS}", head_dim=HEAD_DIM,
                    page_size=PAGE_SIZE, bytes=nbytes, copy_gbps=copy_rate)
        inputs = (q, k, v, block_table, seq_lens, cu_seqlens_q, descales, q_len)
        new_rows = []
        if variant is not None:
            label, changes = variant
            config = dataclasses.replace(base_config, **changes)
            try:
                new_rows += tileattn_rows(base, *inputs, config=config, impl=f"tileattn[{label}]",
                                          timings=("graph",))
            except Exception as error:   # a variant that does not compile or fit is data too
                skipped.append(f"{label} at {base['batch']}x{base['keys']} q{q_len} {name}: "
                               f"{type(error).__name__}: {str(error)[:200]}")
        else:
            new_rows += tileattn_rows(base, *inputs)
            if HAVE_FLASHINFER:
                try:
                    new_rows += flashinfer_rows(base, *inputs)
                except Exception as error:
                    skipped.append(f"flashinfer at {batch}x{keys} q{q_len} {name}: "
                                   f"{type(error).__name__}: {str(error)[:200]}")
        for row in new_rows:
            row["gbps"] = nbytes / row["ms"] / 1e6
            row["fraction_of_copy"] = row["gbps"] / copy_rate
            print(f"{row['impl']:>24} {row['timing']:>5} {name:>7} q{q_len} b{batch:>3} "
                  f"k{keys:>5}: {row['ms']:8.4f} ms {row['gbps']:6.0f} GB/s "
                  f"{row['fraction_of_copy']:5.2f} x copy", flush=True)
        rows += new_rows
        _write(path, facts, copy_rate, rows, skipped, started, sweep)
    _write(path, facts, copy_rate, rows, skipped, started, sweep)
    _summary(rows)
    print(f"skipped {len(skipped)}: " + "; ".join(skipped[:6]))
    print(f"wrote {path}")


def _write(path, facts, copy_rate, rows, skipped, started, sweep):
    payload = dict(facts, grid="decode-sweep" if sweep else "decode", copy_gbps=copy_rate,
                   skipped=skipped, seconds=round(time.time() - started, 1), rows=rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n")


def _summary(rows):
    """The lead's bars: >= 0.85 x copy at batch >= 128 x 4096 keys bf16, FP8 faster than bf16."""
    graph = {(r["impl"], r["dtype"], r["q_len"], r["batch"], r["keys"]): r for r in rows
             if r["timing"] == "graph"}
    for (impl, dtype, q_len, batch, keys), row in sorted(graph.items()):
        if impl != "tileattn" or dtype != "bf16" or batch < 128 or keys < 4096:
            continue
        fp8 = graph.get((impl, "fp8e4m3", q_len, batch, keys))
        ratio = f", FP8 time / bf16 time {fp8['ms'] / row['ms']:.2f}" if fp8 else ""
        print(f"bar: q{q_len} b{batch} k{keys} bf16 {row['fraction_of_copy']:.2f} x copy{ratio}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=pathlib.Path, help="JSON results file to write")
    parser.add_argument("--quick", action="store_true", help="four shapes only")
    parser.add_argument("--sweep", action="store_true", help="config variants on a few shapes")
    parser.add_argument("--budget-s", type=float, default=500.0,
                        help="stop starting new shapes after this many seconds")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/decode.py needs a CUDA GPU")
    run(args.out, quick=args.quick, sweep=args.sweep, budget_s=args.budget_s)


if __name__ == "__main__":
    main()
