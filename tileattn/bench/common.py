"""What every benchmark shares: timing, device facts, ceilings, progress and results files.

Protocol (../shared/BENCHMARKS.md): each measured call is first checked for correctness, then
timed with triton.testing.do_bench(warmup=100, rep=400, return_mode="median"); results are
written as JSON with device, versions and date so that tables and plots are made from them.

Results files: one per GPU and grid, `<results dir>/<gpu>/<grid>.json` (e.g. h100/prefill.json),
rewritten by each complete run of that grid (git keeps the history). A run over part of a grid
(--quick, a subset of head dims, a time box that cut it short) writes `<grid>-partial.json`
beside it instead, so that it can never replace the canonical file by accident. The results
dir is `benchmarks/results` when the current directory is a tileattn source checkout, and
`./tileattn-results` anywhere else (an installed tileattn never writes into its own package).
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import sys
import time

import torch
import triton

CHECKOUT_RESULTS = pathlib.Path("benchmarks") / "results"
ELSEWHERE_RESULTS = pathlib.Path("tileattn-results")


def default_results_dir(cwd: pathlib.Path | None = None) -> pathlib.Path:
    """benchmarks/results in a source checkout's root (it has tileattn/ and benchmarks/results),
    ./tileattn-results elsewhere."""
    cwd = pathlib.Path(cwd or pathlib.Path.cwd())
    if (cwd / CHECKOUT_RESULTS).is_dir() and (cwd / "tileattn" / "__init__.py").is_file():
        return cwd / CHECKOUT_RESULTS
    return cwd / ELSEWHERE_RESULTS


def time_ms(fn) -> float:
    """Median milliseconds of fn() on the current CUDA device."""
    return triton.testing.do_bench(fn, warmup=100, rep=400, return_mode="median")


# Rounds of interleaved timing a grid point: the H100 here is power-bound, and one reading an
# implementation moved the closest ratios 3-6% between runs (docs/design.md, "Benchmarks and
# results").
ROUNDS = 3


def round_order(names: list, r: int) -> list:
    """Round r's order of a point's implementations: rotated by r, so that each takes every
    position in turn (sharing the machine's drift) and none is timed right after itself, which
    read ~5% slower than after another on the power-capped H100 (docs/design.md, "Backward");
    two keep one order (alternating them would time each after itself at every other round's
    start)."""
    if len(names) <= 2:
        return list(names)
    shift = r % len(names)
    return list(names[shift:]) + list(names[:shift])


def time_interleaved(calls: dict, rounds: int = ROUNDS) -> dict:
    """name -> [median milliseconds of each round] for calls timed in `rounds` rounds in
    round_order's orders."""
    names = list(calls)
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in round_order(names, r):
            times[name].append(time_ms(calls[name]))
    return times


def spin_up(seconds: float = 2.0) -> None:
    """Keep the GPU busy for a while before the first timing, so that it is not taken while
    the clocks are still rising (docs/design.md, "Benchmarks and results")."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    start = time.time()
    while time.time() - start < seconds:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def device_facts(device: torch.device | None = None) -> dict:
    device = device or torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    return {
        "device": props.name,
        "capability": f"{props.major}.{props.minor}",
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "date": datetime.date.today().isoformat(),
    }


def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'."""
    for word in name.lower().replace("-", " ").split():
        if word[:1] in "abhlg" and any(ch.isdigit() for ch in word):
            return word
    return name.lower().replace(" ", "_")


def copy_gbps(device: torch.device | None = None, gib: float = 2.0) -> float:
    """HBM copy rate (bytes read + written per second) of y.copy_(x) on `gib` GiB."""
    numel = int(gib * 2**30) // 4
    x = torch.randn(numel, device=device or "cuda")
    y = torch.empty_like(x)
    ms = time_ms(lambda: y.copy_(x))
    del x, y
    return 2 * numel * 4 / (ms * 1e-3) / 1e9


def results_path(grid: str, device_name: str, out_dir=None, complete: bool = True) -> pathlib.Path:
    """Where a run of `grid` on `device_name` writes (module docstring)."""
    out_dir = pathlib.Path(out_dir) if out_dir is not None else default_results_dir()
    name = grid if complete else f"{grid}-partial"
    return out_dir / gpu_slug(device_name) / f"{name}.json"


def write_results(grid: str, payload: dict, out_dir=None, complete: bool = True) -> pathlib.Path:
    """Write payload (device facts and rows) as `<out_dir>/<gpu>/<grid>.json`, replacing the
    previous run's file; `<grid>-partial.json` for a run over part of the grid. Returns the path."""
    path = results_path(grid, payload["device"], out_dir, complete)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {**payload, "grid": grid}
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


def write_json(name: str, payload, out_dir=None) -> pathlib.Path:
    """A maintainer script's output (an A/B, a sweep, a diagnostic) as `<out_dir>/<name>.json`.
    These are evidence for a decision, not results files: out_dir defaults to $OUT when set
    (the GPU session's output folder), else the current directory."""
    out_dir = pathlib.Path(out_dir or os.environ.get("OUT") or ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


def load_results(path) -> dict:
    """A results file; files written before the `grid` field existed get it from their rows."""
    payload = json.loads(pathlib.Path(path).read_text())
    if "grid" not in payload:
        rows = payload.get("rows") or [{}]
        payload["grid"] = ("mla" if "seq_len" in rows[0] else
                           "accuracy" if "rel_vs_quantized" in rows[0] else "prefill")
    return payload


class Progress:
    """A one-line progress bar on stderr (no dependency on tqdm)."""

    def __init__(self, total: int, label: str):
        self.total, self.label, self.done, self.start = total, label, 0, time.time()

    def step(self, what: str = "") -> None:
        self.done += 1
        width = 30
        filled = width * self.done // max(self.total, 1)
        elapsed = time.time() - self.start
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] "
                         f"{self.done}/{self.total} {elapsed:5.0f}s {what[:40]:<40}")
        if self.done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()
