"""What every benchmark shares: timing, device facts, ceilings, progress and results files.

Protocol (../shared/BENCHMARKS.md): each measured call is first checked for correctness, then
timed with triton.testing.do_bench(warmup=100, rep=400, return_mode="median"); results are
written as JSON with device, versions and date so the README tables can be regenerated.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import sys
import time

import torch
import triton

RESULTS_DIR = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def time_ms(fn) -> float:
    """Median milliseconds of fn() on the current CUDA device."""
    return triton.testing.do_bench(fn, warmup=100, rep=400, return_mode="median")


def spin_up(seconds: float = 2.0) -> None:
    """Keep the GPU busy for a while before the first timing, so that it is not taken while
    the clocks are still rising (the first point of one H100 grid ran at half speed)."""
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


def write_results(kind: str, payload: dict, out_dir: pathlib.Path | None = None) -> pathlib.Path:
    """Write benchmarks/results/<date>-<gpu>-<kind>.json (or under out_dir) and return its path."""
    out_dir = pathlib.Path(out_dir or RESULTS_DIR)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{payload['date']}-{gpu_slug(payload['device'])}-{kind}.json"
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


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
