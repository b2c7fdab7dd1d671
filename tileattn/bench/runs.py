"""A run over a grid, or over part of one, under a time budget; and the merge of partial runs.

A grid is a list of points (dicts: a head dim and context, a serving case...), each measured as
a few rows that carry the point's fields. The device lends one GPU at most 10 minutes a call, so
a run stops starting points once its budget is spent, and after every point it writes what it
has as `<grid>-partial.json`: a step killed by its time limit still leaves its rows. A run that
did every point of the full grid writes `<grid>.json` instead (common.write_results) and
removes the partial file it wrote. A full grid longer than one call is run in parts (each a
partial file) and merged: `merge` writes the canonical file once the parts cover the grid.

Payloads record the keys of the points done (`points_done`) and of those left (`skipped`), so
a merge knows what is covered; a later part's rows replace an earlier part's for its points.
"""

from __future__ import annotations

import json
import pathlib
import time

from .common import Progress, load_results, results_path, write_results

# The device allows 600 s a call: leave time to write results and for the steps around it.
DEFAULT_BUDGET_S = 540.0


def point_key(point: dict, fields: tuple[str, ...]) -> tuple:
    """The identity of a point (or of a row measured at it): its values of `fields`, None for
    a field it does not have (a decode point has no context N, a prefill-like one no batch)."""
    return tuple(point.get(field) for field in fields)


class GridRun:
    """One run over `points` of a grid whose full list is `full_points` (same fields).

        run = GridRun("backward", facts, points, full_points, ("D", "causal", "N"), out_dir)
        for point in run:                 # stops once budget_s has passed since construction
            run.add(point, rows_measured_at(point))
        path = run.finish()

    partial: the run leaves part of each point out (fewer peers), so it never writes the
    canonical file. extra: more top-level fields for the payload (batch, heads, copy rate...)."""

    def __init__(self, grid: str, facts: dict, points: list[dict], full_points: list[dict],
                 point_fields: tuple[str, ...], out_dir=None, budget_s: float | None = None,
                 partial: bool = False, **extra):
        self.grid, self.facts, self.points = grid, facts, list(points)
        self.partial = partial
        self.point_fields = tuple(point_fields)
        self.full_keys = {point_key(p, self.point_fields) for p in full_points}
        self.out_dir, self.extra = out_dir, extra
        self.budget_s = DEFAULT_BUDGET_S if budget_s is None else budget_s
        self.started = time.time()
        self.rows: list[dict] = []
        self.done: list[tuple] = []
        self.skipped: list[tuple] = []
        self.wrote_partial = False
        self.progress = Progress(len(self.points), grid)

    def elapsed(self) -> float:
        return time.time() - self.started

    def __iter__(self):
        for index, point in enumerate(self.points):
            if self.elapsed() > self.budget_s:
                self.skipped = [point_key(p, self.point_fields) for p in self.points[index:]]
                print(f"\n{self.grid}: {self.budget_s:.0f} s budget spent, {len(self.skipped)} "
                      "points left for another run")
                return
            yield point

    def add(self, point: dict, rows: list[dict]) -> None:
        """Record the rows measured at point and write the run so far as the partial file."""
        self.rows += rows
        self.done.append(point_key(point, self.point_fields))
        self.progress.step(" ".join(f"{k}={v}" for k, v in point.items()))
        write_results(self.grid, self.payload(), self.out_dir, complete=False)
        self.wrote_partial = True

    def payload(self) -> dict:
        return {**self.facts, **self.extra, "seconds": round(self.elapsed(), 1),
                "points_done": [list(k) for k in self.done],
                "skipped": [list(k) for k in self.skipped], "rows": self.rows}

    def complete(self) -> bool:
        return not self.partial and self.full_keys <= set(self.done)

    def finish(self) -> pathlib.Path:
        """Write the canonical file if every point of the full grid was done, else the partial
        one; returns its path."""
        complete = self.complete()
        path = write_results(self.grid, self.payload(), self.out_dir, complete)
        if complete and self.wrote_partial:
            results_path(self.grid, self.facts["device"], self.out_dir, False).unlink(
                missing_ok=True)
        return path


def merge(paths, full_points: list[dict], point_fields: tuple[str, ...],
          out_dir=None) -> pathlib.Path:
    """Merge partial runs of one grid on one GPU (in order: a later file's rows replace an
    earlier one's for the points it did) and write the result: `<grid>.json` when the points
    done cover full_points, else `<grid>-partial.json`. Returns its path."""
    payloads = [load_results(path) for path in paths]
    merged = merged_payload(payloads, point_fields)
    merged["merged_from"] = [pathlib.Path(p).name for p in paths]
    full_keys = {point_key(p, tuple(point_fields)) for p in full_points}
    done = {tuple(key) for key in merged["points_done"]}
    merged["skipped"] = [list(k) for k in sorted(full_keys - done, key=json.dumps)]
    grid = merged.pop("grid")
    return write_results(grid, merged, out_dir, complete=full_keys <= done)


def merged_payload(payloads: list[dict], point_fields: tuple[str, ...]) -> dict:
    """Payloads of one grid on one GPU as one (in order: a later payload's rows replace an
    earlier one's for the points it did; a payload without `points_done` did the points of
    its rows)."""
    if not payloads:
        raise ValueError("merge needs at least one results file")
    grids = {p["grid"] for p in payloads}
    devices = {p["device"] for p in payloads}
    if len(grids) != 1 or len(devices) != 1:
        raise ValueError(f"files to merge must hold one grid from one GPU, got grids "
                         f"{sorted(grids)} from {sorted(devices)}")
    fields = tuple(point_fields)
    rows_by_point: dict[tuple, list[dict]] = {}
    for payload in payloads:
        if "points_done" in payload:
            done = {tuple(key) for key in payload["points_done"]}
        else:
            done = {point_key(row, fields) for row in payload["rows"]}
        for key in done:
            rows_by_point[key] = []
        for row in payload["rows"]:
            key = point_key(row, fields)
            if key in done:
                rows_by_point[key].append(row)
    ordered = sorted(rows_by_point, key=lambda k: json.dumps(k))
    return {**payloads[-1], "seconds": sum(p.get("seconds", 0) for p in payloads),
            "points_done": [list(k) for k in ordered],
            "rows": [row for key in ordered for row in rows_by_point[key]]}


def add_grid_options(parser, grid: str) -> None:
    """The options every grid script shares: --budget-s, --out and --merge."""
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help="start no new point after this many seconds")
    parser.add_argument("--out", default=None,
                        help="results folder (default: benchmarks/results in a checkout)")
    parser.add_argument("--merge", nargs="+", metavar="JSON",
                        help=f"merge partial runs into {grid}.json (no GPU needed)")


def merged_or_needs_gpu(args, full_points: list[dict], point_fields: tuple[str, ...],
                        script: str) -> bool:
    """With --merge: merges, says where it wrote, and returns True (nothing left to run).
    Otherwise False, after refusing a machine without a CUDA GPU."""
    import torch
    if args.merge:
        print(f"wrote {merge(args.merge, full_points, point_fields, args.out)}")
        return True
    if not torch.cuda.is_available():
        raise SystemExit(f"{script} needs a CUDA GPU")
    return False
