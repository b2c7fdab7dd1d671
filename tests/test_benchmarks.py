"""Benchmarks as a tool and results as data, checked without a GPU: where results files go, what
benchmarks/results may hold, that the maintained scripts run (--help) and never write the
environment, the session runner, and the prefill plot's colours and legend."""

import ast
import importlib.util
import json
import pathlib
import subprocess

import pytest

from tileattn.bench import common, prefill

REPO = pathlib.Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
RESULTS = BENCHMARKS / "results"
GRIDS = {"prefill", "mla", "accuracy", "backward", "serving", "mods"}
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
    if path.name == "sanitizer_cases.py":   # no arguments: run as is under compute-sanitizer
        assert callable(module.main)
        return
    with pytest.raises(SystemExit) as done:
        module.main(["--help"])
    assert done.value.code == 0 and "usage" in capsys.readouterr().out


def test_session_runner_parses_and_explains_itself():
    assert subprocess.run(["bash", "-n", str(BENCHMARKS / "gpu.sh")]).returncode == 0
    done = subprocess.run(["bash", str(BENCHMARKS / "gpu.sh")], capture_output=True, text=True)
    assert done.returncode == 2
    for step in ("tests", "tests-full", "sanitizer", "prefill", "mla", "accuracy", "ncu-mla", "py:"):
        assert step in done.stdout
    assert "`gpu.sh`" in (BENCHMARKS / "README.md").read_text()


def test_prefill_plot_keeps_one_colour_per_column_and_a_legend_of_all():
    """The committed grid has columns missing from some panels (bf16-portable only where the
    Hopper kernel runs, Flex at three contexts): colours must not shift between panels."""
    matplotlib = pytest.importorskip("matplotlib")
    payload = common.load_results(RESULTS / "h100" / "prefill.json")
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
