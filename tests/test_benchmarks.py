"""Benchmarks as a tool and results as data, checked without a GPU: where results files go, what
benchmarks/results may hold, that the maintained scripts run (--help) and never write the
environment, the session runner, partial and merged grid runs, the grids' points and FLOP
counts, and the prefill plot's colours and legend."""

import ast
import dataclasses
import importlib.util
import json
import pathlib
import subprocess

import pytest
import torch

from tileattn.bench import accuracy, common, flex_peer, prefill, runs

REPO = pathlib.Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
RESULTS = BENCHMARKS / "results"
GRIDS = {"prefill", "mla", "accuracy", "backward", "serving", "mods", "fp8", "context"}
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))
FACTS = {"device": "NVIDIA H100 80GB HBM3", "date": "2026-11-24", "rows": [{"x": 1}]}


def test_results_go_to_benchmarks_results_only_in_a_checkout_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert common.default_results_dir() == tmp_path / "tileattn-results"
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    assert common.default_results_dir() == tmp_path / "tileattn-results"   # not tileattn's tree
    (tmp_path / "tileattn").mkdir()
    (tmp_path / "tileattn" / "__init__.py").write_text("")
    assert common.default_results_dir() == tmp_path / "benchmarks" / "results"


def test_write_results_replaces_the_grid_file_and_keeps_partial_runs_apart(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = common.write_results("prefill", FACTS)
    assert first == tmp_path / "tileattn-results" / "h100" / "prefill.json"
    second = common.write_results("prefill", {**FACTS, "rows": [{"x": 2}]})
    assert second == first and json.loads(first.read_text())["rows"] == [{"x": 2}]
    assert json.loads(first.read_text())["grid"] == "prefill"
    partial = common.write_results("prefill", {**FACTS, "rows": [{"x": 3}]}, complete=False)
    assert partial == first.with_name("prefill-partial.json")
    assert json.loads(first.read_text())["rows"] == [{"x": 2}]
    elsewhere = common.write_results("mla", FACTS, out_dir=tmp_path / "out")
    assert elsewhere == tmp_path / "out" / "h100" / "mla.json"


def test_an_installed_tileattn_never_writes_into_its_package(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    package = pathlib.Path(common.__file__).resolve().parents[1]
    path = common.write_results("accuracy", FACTS)
    assert package not in path.resolve().parents


def test_results_folder_holds_only_canonical_files():
    files = [p for p in RESULTS.rglob("*") if p.is_file()]
    assert 0 < len(files) <= 20
    for path in files:
        relative = path.relative_to(RESULTS)
        assert len(relative.parts) == 2, f"{relative}: results/<gpu>/<grid>.json only"
        assert path.suffix in (".json", ".png") and path.stem in GRIDS, relative
        assert path.with_suffix(".json").is_file(), f"{relative} has no results file beside it"
        if path.suffix == ".json":
            payload = json.loads(path.read_text())
            assert payload["grid"] == path.stem
            assert common.gpu_slug(payload["device"]) == relative.parts[0]
            assert {"capability", "torch", "triton", "date"} <= payload.keys() and payload["rows"]


def _environment_writes(source: str) -> list[str]:
    """Lines of source that change os.environ (assignments, del, pop/update/setdefault/clear,
    putenv/unsetenv): benchmarks must choose kernels through use_kernels or launches."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = node.targets if hasattr(node, "targets") else [node.target]
        for target in targets:
            if isinstance(target, ast.Subscript) and "environ" in ast.unparse(target.value):
                found.append(ast.unparse(node))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner, name = ast.unparse(node.func.value), node.func.attr
            if ("environ" in owner and name in ("pop", "update", "setdefault", "clear",
                                                "__setitem__", "popitem")) or \
                    name in ("putenv", "unsetenv"):
                found.append(ast.unparse(node))
    return found


def test_the_environment_scan_finds_writes():
    assert len(_environment_writes("import os\nos.environ['A'] = '1'\nos.environ.pop('B')\n"
                                   "del os.environ['C']\nos.putenv('D', '1')\n")) == 4
    assert _environment_writes("import os\nx = os.environ.get('OUT', '.')\n") == []


@pytest.mark.parametrize("path", SCRIPTS + sorted((REPO / "tileattn" / "bench").glob("*.py")),
                         ids=lambda p: p.name)
def test_no_benchmark_writes_the_environment(path):
    assert _environment_writes(path.read_text()) == []


def _load(path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(f"benchmark_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_maintained_scripts_load_document_and_parse_their_arguments(path, capsys):
    """Each script imports without a GPU (all work is in main), says how to run it, and is
    listed in benchmarks/README.md."""
    module = _load(path)
    assert module.__doc__ and f"benchmarks/{path.name}" in module.__doc__
    assert f"`{path.name}`" in (BENCHMARKS / "README.md").read_text()
    if path.name == "sanitizer_cases.py":   # positional families only: run under compute-sanitizer
        with pytest.raises(SystemExit, match="unknown case families"):
            module.main(["mla", "nope"])   # refused before any case runs
        return
    with pytest.raises(SystemExit) as done:
        module.main(["--help"])
    assert done.value.code == 0 and "usage" in capsys.readouterr().out


RACECHECK_LOG = """========= COMPUTE-SANITIZER
========= Error: Potential RAW hazard detected at __shared__ 0x387ca in block (0,0,0) :
=========     Write Thread (31,0,0) at k+0x5530 in sm90_consumers.py:155
=========     Read Thread (192,0,0) at k+0xe0 in sm90_consumers.py:323
=========     Current Value : 0
========= Error: Potential RAW hazard detected at __shared__ 0x387c9 in block (0,0,0) :
=========     Write Thread (7,0,0) at k+0x5530 in sm90_consumers.py:155
=========     Read Thread (160,0,0) at k+0xe0 in sm90_consumers.py:323
========= Error: Potential WAR hazard detected at __shared__ 0x100 in block (1,0,0) :
=========     Read Thread (300,0,0) at k+0x10 in sm90_fp8.py:180
=========     Write Thread (260,0,0) at k+0x20 in sm90_fp8.py:182
========= RACECHECK SUMMARY: 3 hazards displayed (3 errors, 0 warnings)
"""


def test_racecheck_summary_counts_hazards_by_site_and_warpgroup(tmp_path, capsys):
    module = _load(pathlib.Path(__file__).parent.parent / "benchmarks" / "racecheck_summary.py")
    assert module.summarise(RACECHECK_LOG) == [
        (2, ("RAW", "Write", "sm90_consumers.py:155", 0, "Read", "sm90_consumers.py:323", 1)),
        (1, ("WAR", "Read", "sm90_fp8.py:180", 2, "Write", "sm90_fp8.py:182", 2))]
    log = tmp_path / "racecheck.log"
    log.write_text(RACECHECK_LOG)
    module.main([str(log)])
    assert "RACECHECK SUMMARY: 3 hazards" in capsys.readouterr().out


def test_session_runner_parses_and_explains_itself():
    assert subprocess.run(["bash", "-n", str(BENCHMARKS / "gpu.sh")]).returncode == 0
    done = subprocess.run(["bash", str(BENCHMARKS / "gpu.sh")], capture_output=True, text=True)
    assert done.returncode == 2
    for step in ("tests", "tests-full", "sanitizer", "prefill", "mla", "accuracy", "ncu-mla", "py:",
                 "backward", "serving", "mods", "fp8-accuracy", "backward-full", "serving-full",
                 "mods-full", "CALL_BUDGET_S"):
        assert step in done.stdout
    assert "`gpu.sh`" in (BENCHMARKS / "README.md").read_text()


def test_prefill_plot_keeps_one_colour_per_column_and_a_legend_of_all():
    """A grid with columns missing from some panels (bf16-portable only where the Hopper kernel
    runs, Flex at three contexts; here the committed grid less D=64's portable column): colours
    must not shift between panels."""
    matplotlib = pytest.importorskip("matplotlib")
    payload = common.load_results(RESULTS / "h100" / "prefill.json")
    payload["rows"] = [r for r in payload["rows"]
                       if (r["D"], r["impl"], r["dtype"]) != (64, "tileattn", "bf16-portable")]
    columns = prefill.table_columns(payload["rows"])
    fig = prefill.figure(payload)
    try:
        colours = {}
        for ax in fig.axes:
            for line in ax.get_lines():
                colours.setdefault(line.get_label(), set()).add(matplotlib.colors.to_hex(line.get_color()))
        assert all(len(seen) == 1 for seen in colours.values()), colours
        assert len({next(iter(seen)) for seen in colours.values()}) == len(colours)
        per_panel = [{line.get_label() for line in ax.get_lines()} for ax in fig.axes]
        assert len(set(map(frozenset, per_panel))) > 1, "the test needs panels that differ"
        (legend,) = fig.legends
        assert [text.get_text() for text in legend.get_texts()] == ["-".join(c) for c in columns]
    finally:
        matplotlib.pyplot.close(fig)


def test_column_styles_do_not_depend_on_matplotlib():
    columns = [("tileattn", "bf16"), ("tileattn", "fp8e4m3"), ("cudnn", "bf16")]
    styles = prefill.column_styles(columns)
    assert [styles[c]["color"] for c in columns] == [("tab10", 0), ("tab10", 1), ("tab10", 2)]
    assert styles[("cudnn", "bf16")]["linestyle"] == "--"
    assert prefill.column_styles(columns * 4)[columns[0]]["color"][0] == "tab20"


# ---- the grid scripts ---------------------------------------------------------------------------

GRID_SCRIPTS = {"backward": "backward.py", "serving": "serving.py", "mods": "flex_mods.py"}


def _written_grids(source: str) -> set[str]:
    """Grid names a source writes: write_results("<grid>", ...) and GRID = "<grid>"."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("write_results")
                and node.args and isinstance(node.args[0], ast.Constant)):
            found.add(node.args[0].value)
        if (isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["GRID"]
                and isinstance(node.value, ast.Constant)):
            found.add(node.value.value)
    return found


def test_every_grid_written_is_a_known_grid_with_a_writer_in_the_readme():
    written = set()
    for path in [*SCRIPTS, *(REPO / "tileattn").rglob("*.py")]:
        written |= _written_grids(path.read_text())
    assert {"accuracy", "backward", "serving", "mods"} <= written <= GRIDS
    readme = (BENCHMARKS / "README.md").read_text()
    for grid, script in GRID_SCRIPTS.items():
        assert f"| `{grid}` | `benchmarks/{script}` |" in readme
        assert _written_grids((BENCHMARKS / script).read_text()) == {grid}


@pytest.mark.parametrize("grid", sorted(GRID_SCRIPTS))
def test_grid_scripts_offer_quick_parts_budget_and_merge(grid, capsys):
    module = _load(BENCHMARKS / GRID_SCRIPTS[grid])
    with pytest.raises(SystemExit):
        module.main(["--help"])
    usage = capsys.readouterr().out
    for option in ("--quick", "--budget-s", "--merge", "--out"):
        assert option in usage
    full = module.grid_points()
    keys = [runs.point_key(p, module.POINT_FIELDS) for p in full]
    assert len(set(keys)) == len(keys) > 1
    assert all(set(p) <= set(module.POINT_FIELDS) for p in full)
    quick = module.grid_points(quick=True) if grid != "backward" else module.grid_points(
        **module.QUICK)
    assert 0 < len(quick) < len(full)


FACTS_RUN = {"device": "NVIDIA H100 80GB HBM3", "capability": "9.0", "torch": "2.11",
             "triton": "3.6.0", "date": "2026-11-24"}
POINTS = [dict(D=d, causal=c) for d in (64, 128) for c in (False, True)]


def _rows(point, value):
    return [{**point, "impl": impl, "tflops": value} for impl in ("tileattn", "peer")]


def test_a_grid_run_writes_its_partial_file_after_each_point_and_the_canonical_one_at_the_end(
        tmp_path):
    grid = runs.GridRun("backward", FACTS_RUN, POINTS, POINTS, ("D", "causal"), tmp_path, 60)
    partial = tmp_path / "h100" / "backward-partial.json"
    for index, point in enumerate(grid):
        grid.add(point, _rows(point, index))
        assert len(json.loads(partial.read_text())["rows"]) == 2 * (index + 1)
    path = grid.finish()
    assert path == tmp_path / "h100" / "backward.json" and not partial.exists()
    payload = json.loads(path.read_text())
    assert payload["grid"] == "backward" and len(payload["rows"]) == 8
    assert payload["skipped"] == [] and len(payload["points_done"]) == 4


def test_a_run_over_part_of_the_grid_or_out_of_time_stays_partial(tmp_path):
    part = runs.GridRun("backward", FACTS_RUN, POINTS[:2], POINTS, ("D", "causal"), tmp_path)
    for point in part:
        part.add(point, _rows(point, 1))
    assert part.finish().name == "backward-partial.json"
    fewer = runs.GridRun("backward", FACTS_RUN, POINTS, POINTS, ("D", "causal"),
                         tmp_path / "fewer", partial=True)   # e.g. fewer peers than the grid's
    for point in fewer:
        fewer.add(point, _rows(point, 1))
    assert fewer.finish().name == "backward-partial.json"
    late = runs.GridRun("backward", FACTS_RUN, POINTS, POINTS, ("D", "causal"),
                        tmp_path / "late", budget_s=0)
    late.started -= 1
    assert list(late) == [] and len(late.skipped) == 4
    assert late.finish().name == "backward-partial.json"


def test_merge_writes_the_canonical_file_once_the_parts_cover_the_grid(tmp_path):
    paths = []
    for index, points in enumerate((POINTS[:3], POINTS[2:])):
        part = runs.GridRun("backward", FACTS_RUN, points, POINTS, ("D", "causal"),
                            tmp_path / f"part{index}")
        for point in part:
            part.add(point, _rows(point, 10 * index + 1))
        paths.append(part.finish())
    first = runs.merge(paths[:1], POINTS, ("D", "causal"), tmp_path / "merged")
    assert first.name == "backward-partial.json"
    merged = runs.merge(paths, POINTS, ("D", "causal"), tmp_path / "merged")
    assert merged.name == "backward.json"
    rows = json.loads(merged.read_text())["rows"]
    assert len(rows) == 8   # the shared point once, from the later part
    assert {r["tflops"] for r in rows if (r["D"], r["causal"]) == (128, False)} == {11}
    other = runs.GridRun("serving", FACTS_RUN, POINTS, POINTS, ("D", "causal"), tmp_path / "s")
    for point in other:
        other.add(point, _rows(point, 1))
    with pytest.raises(ValueError, match="one grid"):
        runs.merge([paths[0], other.finish()], POINTS, ("D", "causal"), tmp_path / "x")
    # A payload without points_done (a canonical file merged by hand) did its rows' points.
    by_hand = {**json.loads(paths[0].read_text()), "grid": "backward"}
    by_hand.pop("points_done")
    later = {**json.loads(paths[1].read_text()), "grid": "backward"}
    shown = runs.merged_payload([by_hand, later], ("D", "causal"))
    assert len(shown["rows"]) == 8 and len(shown["points_done"]) == 4


def test_prefill_points_time_their_checked_columns_interleaved(monkeypatch):
    """A prefill point: every column checked against the bf16 yardstick, those that pass timed
    in common.ROUNDS interleaved rounds; a wrong answer and a column that would repeat another
    (bf16-portable where the portable kernel is what bf16 runs) are left out."""
    from torch.nn.attention import SDPBackend
    import tileattn
    for name, value in dict(BATCH=1, HEADS=2).items():
        monkeypatch.setattr(prefill, name, value)
    monkeypatch.setattr(common, "time_ms", _one_ms)
    bf16 = prefill._tileattn("bf16")
    table = {("tileattn", "bf16"): (bf16, lambda q, k, v, causal:
                                    tileattn.attention(q, k, v, causal=causal)),
             ("tileattn", "bf16-portable"): (prefill._tileattn("bf16-portable"),
                                             prefill._portable_attention),
             ("cudnn", "bf16"): (bf16, lambda q, k, v, causal:      # the CPU's yardstick
                                 prefill._sdpa(SDPBackend.MATH)(q, k, v, causal)),
             ("fa4", "bf16"): (bf16, lambda q, k, v, causal: torch.zeros_like(q))}
    point = dict(D=64, causal=True, N=45)
    rows = prefill.measure(point, table, torch.device("cpu"))
    assert [(r["impl"], r["dtype"]) for r in rows] == [("tileattn", "bf16"), ("cudnn", "bf16")]
    for row in rows:
        assert {k: row[k] for k in point} == point and len(row["ms_rounds"]) == common.ROUNDS
        assert row["tflops"] == prefill.flops(45, 64, True) / row["ms"] / 1e9


def test_visible_pairs_count_only_the_visible_work():
    """Causal N(N+1)/2; a window of W keys before the query sees min(i, W) + 1 keys; documents
    are causal blocks; the FLOPs are 4 * D * H per pair."""
    n, window = 300, 37
    assert flex_peer.visible_pairs(flex_peer.causal, 2, n, n, rows_per_chunk=64) == n * (n + 1)
    expected = sum(min(i, window) + 1 for i in range(n))
    assert flex_peer.visible_pairs(flex_peer.sliding_window(window), 1, n, n, rows_per_chunk=50) \
        == expected
    lengths = [5, 100, 195]
    ids = torch.repeat_interleave(torch.arange(3), torch.tensor(lengths))[None]
    assert flex_peer.visible_pairs(flex_peer.document_causal(ids), 1, n, n) == \
        sum(m * (m + 1) // 2 for m in lengths)
    assert flex_peer.mask_flops(flex_peer.causal, 1, 4, 64, n, n) == 4 * 64 * 4 * n * (n + 1) / 2


def test_serving_points_and_work():
    serving = _load(BENCHMARKS / "serving.py")
    lengths = serving.varlen_lengths(**serving.VARLEN)
    assert lengths == serving.varlen_lengths(**serving.VARLEN) and len(lengths) == 32
    assert 128 <= min(lengths) < max(lengths) <= 8192
    fixed = serving.fixed_context(lengths)
    assert fixed % 128 == 0
    assert abs(len(lengths) * fixed ** 2 / sum(n * n for n in lengths) - 1) < 0.15
    full = serving.grid_points()
    cases = [p["case"] for p in full]
    assert {c: cases.count(c) for c in set(cases)} == {
        "varlen": 2, "fixed": 2, "window": 1, "softcap": 1, "nosoftcap": 1, "decode": 72}
    assert {p["case"] for p in serving.grid_points(quick=True)} == {
        "varlen", "window", "softcap", "decode"}


def test_backward_flops_are_multiples_of_the_forward_grid_s():
    backward = _load(BENCHMARKS / "backward.py")
    for causal in (False, True):
        forward = prefill.flops(4096, 128, causal)
        assert backward.pass_flops(4096, 128, causal, "backward") == 2.5 * forward
        assert backward.pass_flops(4096, 128, causal, "forward+backward") == 3.5 * forward
    assert len(backward.grid_points()) == 18


def test_the_accuracy_table_prints_fp8_scale_rows_apart():
    rows = [{"dtype": "bf16", "D": 64, "outliers": False, "rmse_vs_quantized": 1e-4,
             "rel_vs_quantized": 2e-3, "rmse_vs_fp32_inputs": 2e-4, "rel_vs_fp32_inputs": 3e-3}]
    rows += [{"dtype": "fp8e4m3", "D": 128, "scales": scales, "inputs": "outliers", "seed": 0,
              "exact": error, "e4m3": error, "e4m3+offset": error, "rel_vs_fp32_inputs": None}
             for scales, error in (("tensor", 0.304), ("block+smooth+rotate", 0.0763))]
    table = accuracy.format_table(rows)
    assert "RMSE(same in)" in table and "FP8 scales" in table
    assert "block+smooth+rotate" in table and "0.25x" in table


# ---- the grids' measuring code, end to end in the interpreter (timing stubbed) ----------------

def _eager_flex(monkeypatch):
    """torch's flex_attention uncompiled: the CPU stand-in for the compiled peer."""
    from torch.nn.attention.flex_attention import flex_attention
    monkeypatch.setattr(flex_peer, "compiled_flex_attention", lambda: flex_attention)


def _one_ms(call):
    call()
    return 1.0


def test_serving_rows_are_checked_against_the_reference(monkeypatch):
    """Every prefill-like case on small odd shapes: tileattn and Flex rows pass the fp64 check
    (first and last rows of one sequence), and the FLOPs are the exact visible work."""
    serving = _load(BENCHMARKS / "serving.py")
    _eager_flex(monkeypatch)
    for name, value in dict(time_ms=_one_ms, VARLEN=dict(count=3, low=20, high=70, seed=0),
                            CHECK_ROWS=8, NUM_Q_HEADS=4, NUM_KV_HEADS=2, HEAD_DIM=64, HEADS=2,
                            WINDOW=16).items():
        monkeypatch.setattr(serving, name, value)
    points = [dict(case="varlen", dtype="bf16"), dict(case="varlen", dtype="fp8e4m3"),
              dict(case="fixed", dtype="bf16", N=96, batch=3),
              dict(case="window", dtype="bf16", N=77, batch=2),
              dict(case="softcap", dtype="bf16", N=77, batch=2)]
    lengths = serving.varlen_lengths(**serving.VARLEN)
    for point in points:
        rows = serving.measure_prefill(point, torch.device("cpu"))
        assert [r["impl"] for r in rows] == (["tileattn", "flex"] if point["dtype"] == "bf16"
                                             else ["tileattn"])
        for row in rows:
            assert "error" not in row and row["tflops"] == row["flops"] / 1e9, row
            assert row["check_error"] < prefill.CHECK_TOLERANCE[point["dtype"]]
        if point["case"] == "varlen":
            assert rows[0]["flops"] == 4 * 64 * 4 * sum(n * (n + 1) // 2 for n in lengths)
        if point["case"] == "window":
            assert rows[0]["flops"] == 4 * 64 * 4 * 2 * sum(min(i, 16) + 1 for i in range(77))


def test_a_wrong_answer_is_not_timed(monkeypatch):
    serving = _load(BENCHMARKS / "serving.py")
    _eager_flex(monkeypatch)
    for name, value in dict(time_ms=_one_ms, CHECK_ROWS=8, NUM_Q_HEADS=4, HEAD_DIM=64,
                            HEADS=2, WINDOW=16).items():
        monkeypatch.setattr(serving, name, value)
    monkeypatch.setattr(serving.flex_peer, "sliding_window", lambda window: flex_peer.causal)
    rows = serving.measure_prefill(dict(case="window", dtype="bf16", N=77, batch=1),
                                   torch.device("cpu"))
    flex = next(r for r in rows if r["impl"] == "flex")
    assert flex["tflops"] is None and flex["check_error"] > 0.05 and "ms" not in flex


def test_decode_rows_are_checked_and_report_bandwidth(monkeypatch):
    from tileattn.bench import decode as paged
    from tileattn.kernels.attention import decode as decode_kernels
    from tileattn.arch import arch_of
    monkeypatch.setattr(paged, "_timed", lambda call, timings: {t: _one_ms(call) for t in timings})
    for name, value in dict(NUM_Q_HEADS=4, NUM_KV_HEADS=2, HEAD_DIM=64).items():
        monkeypatch.setattr(paged, name, value)
    points = [dict(case="decode", dtype=d, q_len=q, batch=b, keys=n)
              for d in ("bf16", "fp8e4m3") for q, b, n in ((1, 2, 64), (2, 3, 48))]
    gen = torch.Generator().manual_seed(0)
    caches = paged.make_caches(points, torch.device("cpu"), gen)
    for point in points:
        rows = paged.measure(point, caches, 100.0, torch.device("cpu"), gen)
        assert [r["timing"] for r in rows if r["impl"] == "tileattn"] == ["eager", "graph"]
        for row in rows:
            assert row["check_error"] < paged.CHECK_TOLERANCE
            assert row["gbps"] == row["bytes"] / 1e6 and row["fraction_of_copy"] == row["gbps"] / 100
    table_row = decode_kernels.config_for(arch_of(torch.device("cpu")), 64, 64)
    bad = dataclasses.replace(table_row, block_n=24)
    rows = paged.measure(points[0], caches, 100.0, torch.device("cpu"), gen,
                         [("table", table_row), ("bad", bad)])
    assert "gbps" in rows[0] and "error" in rows[1] and "gbps" not in rows[1]


def test_backward_rows_compare_gradients_with_the_yardstick(monkeypatch):
    from torch.nn.attention import SDPBackend
    backward = _load(BENCHMARKS / "backward.py")
    for name, value in dict(BATCH=1, HEADS=2).items():
        monkeypatch.setattr(backward, name, value)
    monkeypatch.setattr(common, "time_ms", _one_ms)
    table = {"tileattn": (False, backward._tileattn(False)),
             "tileattn-deterministic": (False, backward._tileattn(True)),
             "cudnn": (True, backward._sdpa(SDPBackend.MATH))}   # the CPU's yardstick
    rows = backward.measure(dict(D=64, causal=True, N=45), table, torch.device("cpu"))
    assert {(r["impl"], r["pass"]) for r in rows} == {
        (i, p) for i in table for p in ("backward", "forward+backward")}
    assert all(r["distance_to_yardstick"] < backward.CHECK_TOLERANCE for r in rows)
    assert max(r["distance_to_yardstick"] for r in rows) > 0   # tileattn's own gradients
    assert all(len(r["ms_rounds"]) == common.ROUNDS for r in rows)


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_interleaved_rounds_never_time_a_call_right_after_itself(monkeypatch, count):
    timed = []
    monkeypatch.setattr(common, "time_ms", lambda fn: timed.append(fn) or 1.0)
    calls = {f"impl{i}": (lambda: None) for i in range(count)}
    rounds = max(count, 3)
    times = common.time_interleaved(calls, rounds=rounds)
    assert all(len(t) == rounds for t in times.values()) and len(timed) == count * rounds
    if count > 1:
        assert all(a is not b for a, b in zip(timed, timed[1:]))
    if count > 2:   # every implementation takes every position of a round in turn
        positions = {name: {timed.index(call, r * count) - r * count for r in range(rounds)}
                     for name, call in calls.items()}
        assert all(p == set(range(count)) for p in positions.values())


def test_mods_rows_are_checked_against_the_case_s_functions(monkeypatch):
    mods = _load(BENCHMARKS / "flex_mods.py")
    _eager_flex(monkeypatch)
    for name, value in dict(BATCH=2, HEADS=2, HEAD_DIM=64, DOCUMENTS=3, CHECK_ROWS=16).items():
        monkeypatch.setattr(mods, name, value)
    timed = []
    monkeypatch.setattr(common, "time_ms", lambda fn: timed.append(fn) or 1.0)
    inputs = mods.make_inputs(128, torch.device("cpu"))
    for case in ("document", "alibi"):
        timed.clear()
        rows = mods.measure(dict(case=case, dtype="bf16", N=128), inputs, torch.device("cpu"))
        assert [r["impl"] for r in rows] == ["tileattn", "flex"]
        assert all(r["check_error"] <= mods.CHECK_TOLERANCE["bf16"] and r["tflops"] for r in rows)
        # Interleaved rounds: each implementation timed ROUNDS times, never right after itself.
        assert all(r["ms_rounds"] == [1.0] * common.ROUNDS for r in rows)
        assert len(timed) == 2 * common.ROUNDS and timed[0] is timed[2] and timed[1] is timed[3]
        assert all(a is not b for a, b in zip(timed, timed[1:]))
        assert 0 < rows[0]["density"] <= 0.51


def test_peer_wheels_travel_in_folders_under_a_call_s_carry_and_join_whole(tmp_path):
    """benchmarks/peer_wheels.py's layout: a wheel over the part size is split, every folder
    stays under the limit, and the parts (in name order, as gpu.sh joins them) give the wheel."""
    wheels_script = _load(BENCHMARKS / "peer_wheels.py")
    sizes = {"big-1.0-py3-none-any.whl": 1750, "mid-1.0-py3-none-any.whl": 420,
             "small-1.0-py3-none-any.whl": 49}
    originals = {}
    for name, size in sizes.items():
        originals[name] = bytes((7 * i + size) % 256 for i in range(size))
        (tmp_path / name).write_bytes(originals[name])
    files = wheels_script.pieces(sorted(tmp_path.glob("*.whl")), 500)
    assert {f.name for f in files if ".part-" in f.name} == {
        f"big-1.0-py3-none-any.whl.part-{i:02d}" for i in range(4)}
    assert (tmp_path / "big-1.0-py3-none-any.whl.parts").read_text() == "4\n"
    folders = wheels_script.pack(files, 1000)
    assert all(sum(p.stat().st_size for p in folder) <= 1000 for folder in folders)
    assert sorted(p.name for folder in folders for p in folder) == sorted(f.name for f in files)
    parts = sorted(tmp_path.glob("big-1.0-py3-none-any.whl.part-*"))
    assert b"".join(p.read_bytes() for p in parts) == originals["big-1.0-py3-none-any.whl"]


def test_timing_gate_fails_a_throttling_device_and_gpu_sh_runs_it_before_timed_steps():
    """benchmarks/device_health.py: a call whose matmul reads under the floor is void (a lent
    H100 read 694 then 351 TFLOP/s within seconds); gpu.sh runs the gate before a timed step."""
    health = _load(BENCHMARKS / "device_health.py")
    assert health.verdict([730, 695, 687], 550) is None
    assert "351" in health.verdict([694, 381, 351], 550)
    assert health.verdict([351], 0) is None
    script = (BENCHMARKS / "gpu.sh").read_text()
    gate = script.index("benchmarks/device_health.py || exit 3")
    assert gate < script.index('status=0\nfor step in "$@"; do')
