"""The serving grid of ../shared/BENCHMARKS.md: benchmarks/serving.py writes
results/<gpu>/serving.json (packed prefill, its fixed-length twin, sliding window, softcap and
paged decode, each beside its peer measured in the same run).

    python benchmarks/serving.py --quick                  # ~2 min on an H100 (a partial run)
    python benchmarks/serving.py                          # the whole grid (~6-8 min)
    python benchmarks/serving.py --cases varlen fixed window softcap nosoftcap   # ~2.5 min
    python benchmarks/serving.py --cases decode           # ~4-5 min
    python benchmarks/serving.py --merge A.json B.json    # parts -> serving.json when complete

Cases (D = 128 and causal everywhere):
  varlen     tileattn.attention_varlen (validate=False, as on a hot path) over 32 sequences of
             128..8192 tokens (log-uniform, seed 0; 83464 in all), GQA 32/8, bf16 and fp8e4m3
             (per-tensor descales); flex: FlexAttention on the packed sequence with a
             document-causal BlockMask, bf16.
  fixed      the same kind of work in one fixed-length call: tileattn.attention at batch 32, N
             the root mean square of the mix's lengths rounded to 128; flex causal.
  window     tileattn.attention(window_size=(1024, 0)) vs flex's sliding-window BlockMask (the
             same 1025 keys), Z=4 H=32 N=16384 bf16 (--quick: N=4096).
  softcap    tileattn.attention(softcap=30) vs flex's score_mod 30 tanh(s / 30), same shape.
  nosoftcap  the same two calls without softcap: what the hook costs.
  decode     paged GQA decode (tileattn/bench/decode.py says how: a bf16 q over a bf16 or
             fp8e4m3 cache, plan made outside the timed region, eager and CUDA-graph timings,
             FlashInfer where it imports): q_len 1/2/4, GQA 32/8, page 16, batch {1, 32, 128,
             512} x keys {1024, 4096, 16384}.
TFLOP/s rows count only the visible work (tileattn/bench/flex_peer.py: the window's keys only).
Decode rows give GB/s = (K/V read + q read + out written + page ids read) / median time beside
the HBM copy rate of the same run. Every call is checked against the fp64 reference
(tileattn/reference.py) before it is timed: the first and last 256 query rows of one sequence
(decode: the first two sequences). Rows: {"case", "impl", "dtype", "N", "batch", "q_len",
"keys" (the point's fields), "ms", "tflops" or "gbps" and "copy_gbps", "check_error", ...}.
"""

from __future__ import annotations

import argparse
import math
import random

import torch

from tileattn.bench import decode as paged
from tileattn.bench import flex_peer, runs
from tileattn.bench.common import copy_gbps, device_facts, spin_up, time_ms
from tileattn.bench.prefill import BATCH, CHECK_TOLERANCE, HEADS

GRID = "serving"
POINT_FIELDS = ("case", "dtype", "N", "batch", "q_len", "keys")
CASES = ("varlen", "fixed", "window", "softcap", "nosoftcap", "decode")
DTYPES = ("bf16", "fp8e4m3")
HEAD_DIM, NUM_Q_HEADS, NUM_KV_HEADS = paged.HEAD_DIM, paged.NUM_Q_HEADS, paged.NUM_KV_HEADS
VARLEN = dict(count=32, low=128, high=8192, seed=0)
MASK_CONTEXT, QUICK_MASK_CONTEXT = 16384, 4096
WINDOW, SOFTCAP = 1024, 30.0
DECODE_Q_LENS, DECODE_BATCHES, DECODE_KEYS = (1, 2, 4), (1, 32, 128, 512), (1024, 4096, 16384)
QUICK_DECODE = ((1, 16384), (128, 4096))          # (batch, keys) at q_len 1
CHECK_ROWS = 256


def varlen_lengths(count=32, low=128, high=8192, seed=0) -> list[int]:
    """The varlen case's sequence lengths: log-uniform in [low, high] from a fixed seed."""
    rng = random.Random(seed)
    return [int(round(math.exp(rng.uniform(math.log(low), math.log(high))))) for _ in range(count)]


def fixed_context(lengths: list[int]) -> int:
    """N of the fixed-length twin: the lengths' root mean square (the same sum of n^2, so the
    same causal work at batch len(lengths)), rounded to a multiple of 128."""
    rms = math.sqrt(sum(n * n for n in lengths) / len(lengths))
    return max(128, round(rms / 128) * 128)


def grid_points(quick: bool = False, cases=CASES) -> list[dict]:
    """The points of the grid (quick: its ~2-minute subset), each a dict of POINT_FIELDS."""
    lengths = varlen_lengths(**VARLEN)
    dtypes = ("bf16",) if quick else DTYPES
    context = QUICK_MASK_CONTEXT if quick else MASK_CONTEXT
    decode_shapes = ([(1, batch, keys) for batch, keys in QUICK_DECODE] if quick else
                     [(q, b, n) for q in DECODE_Q_LENS for b in DECODE_BATCHES
                      for n in DECODE_KEYS])
    points = []
    for case in cases:
        if case == "varlen":
            points += [dict(case=case, dtype=d) for d in dtypes]
        elif case == "fixed" and not quick:
            points += [dict(case=case, dtype=d, N=fixed_context(lengths), batch=len(lengths))
                       for d in DTYPES]
        elif case in ("window", "softcap") or (case == "nosoftcap" and not quick):
            points.append(dict(case=case, dtype="bf16", N=context, batch=BATCH))
        elif case == "decode":
            points += [dict(case=case, dtype=d, q_len=q, batch=b, keys=n)
                       for d in DTYPES for q, b, n in decode_shapes]
    return points


# ---- prefill-like cases: varlen, fixed, window, softcap, nosoftcap ----------------------------

def _typed(tensors, dtype: str):
    """fp32 inputs as the point's dtype: bf16, or e4m3 with per-tensor descales."""
    import tileattn
    if dtype == "bf16":
        return [x.to(torch.bfloat16) for x in tensors], {}
    quantized = [tileattn.quantize_fp8(x) for x in tensors]
    names = ("q_descale", "k_descale", "v_descale")
    return [x for x, _ in quantized], {n: d for n, (_, d) in zip(names, quantized)}


def reference_error(out, q, k, v, **options) -> float:
    """Relative L2 error of one sequence's output rows out [n, H, Dv] (first and last
    CHECK_ROWS) against the fp64 reference on its q [n, Hq, D], k, v [n, Hkv, D] (causal;
    options: window_size, softcap, descales). The first rows see only the first keys, the
    last rows are bottom-right aligned over all of them."""
    from tileattn.reference import attention_reference
    n = q.shape[0]
    r = min(CHECK_ROWS, n)
    first, _ = attention_reference(q[None, :r], k[None, :r], v[None, :r], causal=True, **options)
    last, _ = attention_reference(q[None, n - r:], k[None], v[None], causal=True, **options)
    want = torch.cat([first[0], last[0]])
    got = torch.cat([out[:r], out[n - r:]]).double()
    return float((got - want).norm() / want.norm())


def prefill_calls(point: dict, device):
    """(flops, [(impl, call, rows of the checked sequence from call's output)], that
    sequence's (q, k, v), reference options) for a varlen/fixed/window/softcap point."""
    import tileattn
    from torch.nn.attention.flex_attention import create_block_mask
    case, dtype = point["case"], point["dtype"]
    gen = torch.Generator(device=device).manual_seed(0)
    kv_heads = HEADS if case in ("window", "softcap", "nosoftcap") else NUM_KV_HEADS
    options = dict(window_size=(WINDOW, 0)) if case == "window" else (
        dict(softcap=SOFTCAP) if case == "softcap" else {})
    score_mod = flex_peer.softcap(SOFTCAP) if case == "softcap" else None
    if case == "varlen":
        lengths = varlen_lengths(**VARLEN)
        total, longest = sum(lengths), max(range(len(lengths)), key=lengths.__getitem__)
        starts = [0]
        for n in lengths:
            starts.append(starts[-1] + n)
        cu_seqlens = torch.tensor(starts, dtype=torch.int32, device=device)
        shapes = [(total, heads, HEAD_DIM) for heads in (NUM_Q_HEADS, kv_heads, kv_heads)]
        (q, k, v), descales = _typed([torch.randn(s, device=device, generator=gen)
                                      for s in shapes], dtype)
        sequence = lambda x: x[starts[longest]:starts[longest + 1]]   # noqa: E731
        document_ids = torch.repeat_interleave(torch.arange(len(lengths), device=device),
                                               torch.tensor(lengths, device=device))[None]
        mask, batch, context = flex_peer.document_causal(document_ids), 1, total
        tileattn_call = lambda: tileattn.attention_varlen(   # noqa: E731 (hot path: no host sync)
            q, k, v, cu_seqlens, cu_seqlens, max(lengths), max(lengths), causal=True,
            validate=False, **descales)
        as_flex = lambda x: x.transpose(0, 1)[None]           # noqa: E731 [1, H, total, D]
        flex_rows = lambda out: sequence(out[0].transpose(0, 1))   # noqa: E731
    else:
        batch, context = point["batch"], point["N"]
        shapes = [(batch, context, heads, HEAD_DIM) for heads in (NUM_Q_HEADS, kv_heads, kv_heads)]
        (q, k, v), descales = _typed([torch.randn(s, device=device, generator=gen)
                                      for s in shapes], dtype)
        sequence = lambda x: x[0]                             # noqa: E731
        mask = flex_peer.sliding_window(WINDOW) if case == "window" else flex_peer.causal
        tileattn_call = lambda: tileattn.attention(q, k, v, causal=True, **options,  # noqa: E731
                                                   **descales)
        as_flex = lambda x: x.transpose(1, 2)                  # noqa: E731 [B, H, N, D]
        flex_rows = lambda out: out[0].transpose(0, 1)         # noqa: E731
    flops = flex_peer.mask_flops(mask, batch, NUM_Q_HEADS, HEAD_DIM, context, context, device)
    calls = [("tileattn", tileattn_call, sequence)]
    if dtype == "bf16":
        block_mask = create_block_mask(mask, batch if case == "varlen" else None, None, context,
                                       context, device=device)
        flex = flex_peer.compiled_flex_attention()
        flex_inputs = [as_flex(x) for x in (q, k, v)]
        calls.append(("flex", lambda: flex(*flex_inputs, score_mod=score_mod,
                                           block_mask=block_mask,
                                           enable_gqa=kv_heads != NUM_Q_HEADS), flex_rows))
    return flops, calls, [sequence(x) for x in (q, k, v)], {**options, **descales}


def measure_prefill(point: dict, device) -> list[dict]:
    flops, calls, checked, options = prefill_calls(point, device)
    rows = []
    for impl, call, rows_of in calls:
        row = {**point, "impl": impl, "flops": flops}
        try:
            row["check_error"] = reference_error(rows_of(call()), *checked, **options)
            if row["check_error"] < CHECK_TOLERANCE[point["dtype"]]:
                row["ms"] = time_ms(call)
                row["tflops"] = flops / row["ms"] / 1e9
            else:
                row["tflops"] = None
                print(f"\n{impl} {point}: error {row['check_error']:.3g}, not timed")
        except Exception as error:  # noqa: BLE001 - recorded; the other rows go on
            row.update(tflops=None, error=f"{type(error).__name__}: {str(error)[:300]}")
            print(f"\n{impl} {point}: {row['error']}")
        rows.append(row)
    return rows


# ---- the grid -------------------------------------------------------------------------------

def format_table(rows: list[dict]) -> str:
    """One line per row, with tileattn's ratio to the best peer of its point and timing."""
    def point_of(row):
        return (runs.point_key(row, POINT_FIELDS), row.get("timing"))
    best_peer: dict = {}
    for row in rows:
        if not row["impl"].startswith("tileattn") and (row.get("tflops") or row.get("gbps")):
            rate = row.get("tflops") or row.get("gbps")
            best_peer[point_of(row)] = max(best_peer.get(point_of(row), 0), rate)
    lines = []
    for row in rows:
        shape = " ".join(f"{f}={row[f]}" for f in POINT_FIELDS[2:] if row.get(f) is not None)
        rate = row.get("tflops") or row.get("gbps")
        unit = "TFLOP/s" if "tflops" in row else "GB/s"
        text = (f"{row['case']:>9} {row['impl']:>22} {row.get('timing', ''):>5} "
                f"{row['dtype']:>7} {shape:<34}")
        if rate is None:
            lines.append(text + "  " + row.get("error", "not timed"))
            continue
        text += f" {rate:8.1f} {unit}"
        if "copy_gbps" in row:
            text += f" ({rate / row['copy_gbps']:.2f} of copy)"
        peer = best_peer.get(point_of(row))
        if row["impl"] == "tileattn" and peer:
            text += f"  {rate / peer:.2f}x best peer"
        lines.append(text)
    return "\n".join(lines)


def run(args) -> None:
    device = torch.device("cuda")
    points = grid_points(args.quick, args.cases)
    facts = device_facts(device)
    decode_points = [p for p in points if p["case"] == "decode"]
    spin_up()
    copy_rate = copy_gbps(device) if decode_points else None
    grid = runs.GridRun(GRID, facts, points, grid_points(), POINT_FIELDS, args.out,
                        args.budget_s, copy_gbps=copy_rate, varlen_lengths=varlen_lengths(**VARLEN))
    gen = torch.Generator(device=device).manual_seed(0)
    caches = None
    for point in grid:
        if point["case"] != "decode":
            rows = measure_prefill(point, device)
        else:
            caches = caches or paged.make_caches(decode_points, device, gen)
            rows = paged.measure(point, caches, copy_rate, device, gen)
        grid.add(point, rows)
        torch.cuda.empty_cache()
    path = grid.finish()
    print("\n" + format_table(grid.rows))
    print(f"results: {path}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/serving.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="bf16 varlen, window and softcap at N=4096, 4 decode points")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES),
                        help="the part of the grid to run")
    runs.add_grid_options(parser, "serving")
    args = parser.parse_args(argv)
    if not runs.merged_or_needs_gpu(args, grid_points(), POINT_FIELDS, "benchmarks/serving.py"):
        run(args)


if __name__ == "__main__":
    main()
