"""The paged decode config sweep: benchmarks/decode.py times variants of the decode kernel's
config row (tileattn/kernels/attention/decode.py, CONFIGS) on a few shapes, each from CUDA
graphs, and writes `decode-sweep.json` under --out (default $OUT, else .): evidence for that
table. The decode grid itself is part of the serving grid (benchmarks/serving.py --cases
decode); both measure as tileattn/bench/decode.py says.

    python benchmarks/decode.py --sweep                       # every variant, ~3 min on an H100
    python benchmarks/decode.py --sweep --variants table page-tiles
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from tileattn.bench import decode as paged
from tileattn.bench import runs
from tileattn.bench.common import copy_gbps, device_facts, spin_up, write_json

# (batch, keys, q_len, cache dtype): a bandwidth-bound batch in both caches, a smaller batch,
# one long sequence (split-KV) and speculative decoding.
SWEEP_POINTS = [dict(case="decode", dtype=d, q_len=q, batch=b, keys=n) for b, n, q, d in (
    (128, 4096, 1, "bf16"), (128, 4096, 1, "fp8e4m3"), (32, 4096, 1, "bf16"),
    (1, 16384, 1, "bf16"), (512, 1024, 4, "bf16"))]
VARIANTS = {
    "table": {}, "page-tiles": {"gather_small_pages": False},
    "page-tiles-s4": {"gather_small_pages": False, "num_stages": 4},
    "N32": {"block_n": 32}, "N128": {"block_n": 128}, "s2": {"num_stages": 2},
    "s4": {"num_stages": 4}, "w2": {"num_warps": 2}, "w8": {"num_warps": 8},
    "inflight64": {"inflight_kb_per_sm": 64}, "inflight256": {"inflight_kb_per_sm": 256},
    "chunk128": {"min_chunk": 128}, "chunk1024": {"min_chunk": 1024},
}


def sweep(args) -> None:
    from tileattn.arch import arch_of
    from tileattn.kernels.attention import decode as decode_kernels
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    spin_up()
    copy_rate = copy_gbps(device)
    caches = paged.make_caches(SWEEP_POINTS, device, gen)
    table_row = decode_kernels.config_for(arch_of(device), paged.HEAD_DIM, paged.HEAD_DIM)
    variants = [(label, dataclasses.replace(table_row, **VARIANTS[label]))
                for label in args.variants]
    rows, skipped, started = [], [], time.time()
    for index, point in enumerate(SWEEP_POINTS):
        if time.time() - started > args.budget_s:
            skipped = SWEEP_POINTS[index:]
            break
        new_rows = paged.measure(point, caches, copy_rate, device, gen, variants)
        for row in new_rows:
            rate = f"{row['fraction_of_copy']:.2f} x copy" if "gbps" in row else row["error"]
            print(f"{row['impl']:>22} {point['dtype']:>7} q{point['q_len']} b{point['batch']:>3} "
                  f"k{point['keys']:>5}: {rate}", flush=True)
        rows += new_rows
    path = write_json("decode-sweep", {**device_facts(device), "copy_gbps": copy_rate,
                                       "skipped": skipped, "rows": rows}, args.out)
    print(f"wrote {path}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/decode.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", required=True,
                        help="time config variants (the grid is benchmarks/serving.py's)")
    parser.add_argument("--variants", nargs="+", choices=tuple(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--budget-s", type=float, default=runs.DEFAULT_BUDGET_S,
                        help="start no new shape after this many seconds")
    parser.add_argument("--out", default=None, help="folder for the JSON (default $OUT, else .)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/decode.py needs a CUDA GPU")
    sweep(args)


if __name__ == "__main__":
    main()
