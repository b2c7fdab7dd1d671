"""The MLA decode grid of ../shared/BENCHMARKS.md: tileattn's two schedules beside torch.

Every shape gets a paged latent cache whose pages are a random permutation (so consecutive
pages of a sequence are not adjacent in memory) and a plan made outside the timed region, as a
serving engine would (one plan per step, reused by every layer). The "torch" peer is the
straightforward implementation: gather the pages, QK^T, softmax in fp32, P@V.

The full grid is 576 shapes × 3 implementations; timed at the protocol's rep it would take
far over the 6-minute budget, so the grid is cut (see _grid below: all of page_size 64 bf16
q_len 1; q_len 2/4, FP8 and page_size 1 on subsets) and timed with do_bench(warmup=25,
rep=100). The run prints what it skipped. tileattn rows are also timed replayed from a CUDA
graph (ms_graph, gbps_graph, tflops_graph): a serving engine captures its decode step, and at
small batches the eager time is mostly Python and launch overhead.
"""

from __future__ import annotations

import math
import time

import torch
import triton

import tileattn

from .common import Progress, copy_gbps, device_facts, results_path, write_results

HEAD_DIM_QK, HEAD_DIM_V = 576, 512
SCHEDULES = ("split_dv", "dup_qk")
# Relative L2 distance of a timed tileattn output from the torch peer's (both bf16 outputs;
# FP8 cache rows compare to torch run on the same dequantised cache).
CHECK_TOLERANCE = 2e-2
# Skip the torch peer where its fp32 scores alone would pass this many bytes.
TORCH_SCORE_BYTES = 4 << 30


def _grid(quick: bool) -> list[tuple]:
    """(batch, seq_len, heads, q_len, page_size, kv_dtype name)."""
    heads_all, batches, seqs = (16, 32, 64, 128), (1, 32, 128, 768), (1024, 2048, 8192)
    if quick:
        return [(b, s, h, 1, 64, "bf16") for b in (1, 32, 768) for s in (2048,) for h in (16, 128)]
    grid = [(b, s, h, 1, 64, "bf16") for b in batches for s in seqs for h in heads_all]
    grid += [(b, 2048, h, q, 64, "bf16") for q in (2, 4) for b in batches for h in (16, 64, 128)]
    grid += [(b, s, h, 1, 64, "fp8") for b in batches for s in (2048, 8192) for h in heads_all]
    grid += [(b, s, h, 1, 1, "bf16") for b in (32, 768) for s in (1024, 2048) for h in (16, 128)]
    return grid


def _time_ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def _time_graph_ms(fn) -> float:
    """The same call replayed from a CUDA graph, as a serving engine runs its decode step:
    no Python or launch overhead, so short calls show the kernels' own time."""
    return triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median")


def torch_mla_decode(q, kv_cache, page_table, seq_len: int, softmax_scale: float, kv_descale):
    """The peer: every sequence has seq_len keys (the grid's batches are uniform)."""
    batch, q_len, heads, _ = q.shape
    page_size = kv_cache.shape[1]
    pages = page_table[:, : -(-seq_len // page_size)].long()
    kv = kv_cache[pages].reshape(batch, -1, HEAD_DIM_QK)[:, :seq_len]
    if kv.dtype != q.dtype:
        kv = (kv.to(torch.float32) * kv_descale).to(q.dtype)
    scores = torch.matmul(q.reshape(batch, q_len * heads, HEAD_DIM_QK), kv.transpose(1, 2))
    scores = scores.float() * softmax_scale
    if q_len > 1:
        token = torch.arange(q_len, device=q.device).repeat_interleave(heads)
        hidden = torch.arange(seq_len, device=q.device)[None, :] >= (seq_len - q_len + 1 + token)[:, None]
        scores = scores.masked_fill(hidden, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    return torch.matmul(probs, kv[..., :HEAD_DIM_V]).reshape(batch, q_len, heads, HEAD_DIM_V)


def make_cache(batch, seq_len, page_size, kv_dtype, device, gen):
    """(kv_cache, page_table, kv_descale): a paged latent cache of `batch` sequences of seq_len
    keys in random pages (a permutation, so a sequence's pages are not adjacent), bf16 or, for
    kv_dtype "fp8", e4m3 with a per-tensor descale. The MLA benchmark scripts share it."""
    pages_per_seq = -(-seq_len // page_size)
    num_pages = batch * pages_per_seq
    kv = torch.randn(num_pages, page_size, HEAD_DIM_QK, device=device, generator=gen,
                     dtype=torch.bfloat16)
    descale = None
    if kv_dtype == "fp8":
        descale = torch.tensor(kv.abs().amax().float().item() / 448.0, device=device)
        kv = (kv.float() / descale).to(torch.float8_e4m3fn)
    page_table = torch.randperm(num_pages, device=device, generator=gen).to(torch.int32)
    return kv, page_table.reshape(batch, pages_per_seq), descale


def run(out_dir=None, quick: bool = False, budget_s: float = 330.0):
    """Time the grid, stopping at budget_s seconds (the shapes left are listed as skipped).
    Results are written after every shape (mla-partial.json), so an interrupted run still
    leaves its data; a complete run then writes mla.json (common.write_results)."""
    device = torch.device("cuda")
    facts = device_facts(device)
    copy_rate = copy_gbps(device)
    grid = _grid(quick)
    print(f"MLA decode on {facts['device']}: {len(grid)} shapes (time-boxed grid, "
          f"do_bench warmup=25 rep=100); HBM copy rate {copy_rate:.0f} GB/s", flush=True)
    rows, skipped, past_budget = [], [], False
    gen = torch.Generator(device=device).manual_seed(0)
    progress = Progress(len(grid), "mla")
    cache_key, cache = None, None
    started = time.time()
    for index, (batch, seq_len, heads, q_len, page_size, kv_name) in enumerate(grid):
        if time.time() - started > budget_s:
            skipped += [f"shape {shape} (over the {budget_s:.0f} s budget)" for shape in grid[index:]]
            past_budget = True
            break
        key = (batch, seq_len, page_size, kv_name)
        if key != cache_key:
            cache = None
            torch.cuda.empty_cache()
            cache, cache_key = make_cache(batch, seq_len, page_size, kv_name, device, gen), key
        kv_cache, page_table, kv_descale = cache
        q = torch.randn(batch, q_len, heads, HEAD_DIM_QK, device=device, generator=gen,
                        dtype=torch.bfloat16)
        seq_lens = torch.full((batch,), seq_len, dtype=torch.int32, device=device)
        scale = 1.0 / math.sqrt(192)   # DeepSeek's softmax scale (qk_nope 128 + rope 64)
        tokens = batch * seq_len
        kv_bytes = tokens * HEAD_DIM_QK * kv_cache.element_size()
        io_bytes = kv_bytes + q.numel() * 2 + batch * q_len * heads * HEAD_DIM_V * 2
        flops = 2 * heads * q_len * (HEAD_DIM_QK + HEAD_DIM_V) * tokens
        base = dict(batch=batch, seq_len=seq_len, heads=heads, q_len=q_len, page_size=page_size,
                    kv_dtype=kv_name)

        expected = None
        if batch * q_len * heads * seq_len * 4 <= TORCH_SCORE_BYTES:
            peer = lambda: torch_mla_decode(q, kv_cache, page_table, seq_len, scale, kv_descale)
            expected = peer()
            ms = _time_ms(peer)
            rows.append(dict(base, impl="torch", ms=ms, gbps=io_bytes / ms / 1e6,
                             tflops=flops / ms / 1e9))
        else:
            skipped.append(f"torch at {base}")
        for schedule in SCHEDULES:
            plan = tileattn.mla_plan(seq_lens, num_heads=heads, q_len=q_len, page_size=page_size,
                                     kv_dtype=kv_cache.dtype, device=device, schedule=schedule)
            # validate=False: a serving step checks its page table once, not per layer (the
            # default host check outside graph capture synchronises every call).
            call = lambda: tileattn.mla_decode(q, kv_cache, page_table, seq_lens,
                                               softmax_scale=scale, kv_descale=kv_descale,
                                               plan=plan, validate=False)
            out = call()
            error = None
            if expected is not None:
                error = float((out.float() - expected.float()).norm() / expected.float().norm())
                if not error < CHECK_TOLERANCE:
                    raise AssertionError(f"tileattn {schedule} differs from torch by {error:.2e} at {base}")
            ms = _time_ms(call)
            ms_graph = _time_graph_ms(call)
            rows.append(dict(base, impl=f"tileattn-{schedule}", ms=ms, gbps=io_bytes / ms / 1e6,
                             tflops=flops / ms / 1e9, ms_graph=ms_graph,
                             gbps_graph=io_bytes / ms_graph / 1e6,
                             tflops_graph=flops / ms_graph / 1e9, rel_error_vs_torch=error,
                             num_work=plan.num_work, num_splits=plan.num_slots,
                             chunk_size=plan.chunk_size))
        progress.step(f"b{batch} s{seq_len} h{heads} q{q_len} p{page_size} {kv_name}")
        path = _write(facts, copy_rate, skipped, started, rows, out_dir, complete=False)
    complete = not quick and not past_budget
    path = _write(facts, copy_rate, skipped, started, rows, out_dir, complete)
    if complete:   # the interim copy written after each shape
        results_path("mla", facts["device"], out_dir, complete=False).unlink(missing_ok=True)
    print(format_table(rows, copy_rate))
    print(f"skipped {len(skipped)} points: torch where its scores exceed "
          f"{TORCH_SCORE_BYTES >> 30} GiB, shapes past the budget; wrote {path}")
    return path


def _write(facts, copy_rate, skipped, started, rows, out_dir, complete):
    payload = dict(facts, copy_gbps=copy_rate, grid_note=(
        "time-boxed: page_size 64 bf16 q_len 1 full; q_len 2/4 at seq 2048 heads 16/64/128; "
        "fp8 at seq 2048/8192 all heads; page_size 1 at batch 32/768 seq 1024/2048 heads "
        "16/128; do_bench warmup=25 rep=100; mla_decode(validate=False)"), skipped=skipped,
        seconds=round(time.time() - started, 1), rows=rows)
    return write_results("mla", payload, out_dir, complete)


def format_table(rows, copy_rate) -> str:
    """One line per row: time, GB/s and its fraction of the copy rate, TFLOP/s, graph time."""
    lines = [f"{'batch':>5} {'seq':>5} {'H':>3} {'qlen':>4} {'page':>4} {'kv':>4} {'impl':>17} "
             f"{'ms':>8} {'GB/s':>7} {'%copy':>5} {'TFLOP/s':>7} {'graph ms':>8} {'%copy':>5}"]
    for r in rows:
        graph = (f" {r['ms_graph']:>8.4f} {100 * r['gbps_graph'] / copy_rate:>5.0f}"
                 if "ms_graph" in r else "")
        lines.append(f"{r['batch']:>5} {r['seq_len']:>5} {r['heads']:>3} {r['q_len']:>4} "
                     f"{r['page_size']:>4} {r['kv_dtype']:>4} {r['impl']:>17} {r['ms']:>8.4f} "
                     f"{r['gbps']:>7.0f} {100 * r['gbps'] / copy_rate:>5.0f} "
                     f"{r['tflops']:>7.1f}{graph}")
    return "\n".join(lines)
