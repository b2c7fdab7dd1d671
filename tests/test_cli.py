"""The command line on a machine without a GPU says which path runs the kernels: Triton's CPU
interpreter (with tileattn's corrections) or none at all, in which case it explains how to run
on the CPU instead of crashing or listing configs that cannot run. `bench` refuses with a clear
message; `plot` reads the canonical results files."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch

from tileattn import __main__ as cli

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only behaviour")

REPO = pathlib.Path(__file__).resolve().parents[1]
CANONICAL = REPO / "benchmarks" / "results" / "h100"


def run_cli(*args, interpreter: bool):
    """python -m tileattn in a fresh process, with or without TRITON_INTERPRET=1 (the test
    session itself runs with it, set by conftest.py)."""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    if interpreter:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, "-m", "tileattn", *args], capture_output=True,
                          text=True, timeout=300, env=env, cwd=REPO)


@pytest.mark.parametrize("args", [("bench",), ("bench", "--mla")], ids=["prefill", "mla"])
def test_bench_without_a_gpu_says_so(args):
    done = run_cli(*args, interpreter=False)
    assert done.returncode == 1
    assert "needs a CUDA GPU" in done.stderr and "Traceback" not in done.stderr


def test_info_without_the_interpreter_lists_nothing_that_cannot_run():
    done = run_cli("info", interpreter=False)
    assert done.returncode == 0, done.stderr
    assert "device: CPU" in done.stdout
    assert "kernels run: nowhere" in done.stdout
    assert "TRITON_INTERPRET=1 python -m tileattn info" in done.stdout
    assert "TileConfig" not in done.stdout and "MLAConfig" not in done.stdout


def test_accuracy_without_the_interpreter_explains_how_to_run_on_the_cpu():
    done = run_cli("accuracy", interpreter=False)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "TRITON_INTERPRET=1 python -m tileattn accuracy" in done.stderr


def test_info_in_the_interpreter_names_it_and_its_configs(capsys):
    cli.main(["info"])
    out = capsys.readouterr().out
    assert "kernels run: the Triton kernels in Triton's CPU interpreter, with tileattn's " \
           "corrections" in out
    assert "the interpreter's small tiles" in out
    assert "TileConfig(block_m=32, block_n=16" in out   # the interpreter's row (fwd.CONFIGS)
    assert "Hopper" not in out
    assert "D=128: dK/dV portable TileConfig(block_m=16, block_n=16" in out
    assert "Gluon" not in out


def test_info_for_a_hopper_row_names_the_gluon_backward_rows(capsys, monkeypatch):
    import tileattn.arch
    from tileattn.kernels.attention import sm90_bwd
    monkeypatch.setattr(tileattn.arch, "arch_of",
                        lambda device: tileattn.arch.arch_for_capability((9, 0)))
    cli.main(["info"])
    out = capsys.readouterr().out
    assert f"D=128: dK/dV Gluon {sm90_bwd.DKDV_CONFIGS[128]}, dQ Gluon {sm90_bwd.DQ_CONFIGS[128]}" in out
    assert "D=64: dK/dV portable TileConfig(block_m=32, block_n=128" in out
    assert f"D=256: dK/dV portable TileConfig(block_m=64, block_n=64, num_warps=8, num_stages=2), dQ Gluon {sm90_bwd.DQ_CONFIGS[256]}" in out


def test_accuracy_in_the_interpreter_says_so_and_writes_no_results(capsys, tmp_path):
    cli.main(["accuracy", "--head-dims", "64", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert out.startswith("accuracy of the Triton kernels in Triton's CPU interpreter")
    rows = [line.split() for line in out.splitlines() if line.startswith(("bf16", "fp16", "fp8"))]
    assert sorted({row[0] for row in rows}) == ["bf16", "fp16", "fp8e4m3", "fp8e5m2"]
    assert all(row[1] == "64" and float(row[4]) < 5e-2 for row in rows)   # rel. error, same inputs
    assert not any(tmp_path.iterdir())


def test_demo_without_a_gpu_reruns_itself_in_the_interpreter(monkeypatch):
    """Checked in-process: the re-executed demo itself runs for ~30 s in the interpreter."""
    calls = []

    class Reexec(Exception):
        pass

    def execve(path, argv, env):
        calls.append((path, argv, env))
        raise Reexec

    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(cli.os, "execve", execve)
    monkeypatch.setattr(sys, "argv", ["tileattn", "demo"])
    with pytest.raises(Reexec):
        cli.main(["demo"])
    (path, argv, env), = calls
    assert argv == [sys.executable, "-m", "tileattn", "demo"] and path == sys.executable
    assert env["TRITON_INTERPRET"] == "1"
    assert "TRITON_INTERPRET" not in os.environ   # the CLI passes it on, it does not set it here


def test_execution_path_in_the_interpreter():
    kind, words = cli.execution_path()
    assert kind == "interpreter" and "with tileattn's corrections" in words


def test_plot_reads_the_canonical_files(capsys, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    root = tmp_path / "benchmarks" / "results" / "h100"
    root.mkdir(parents=True)
    (tmp_path / "tileattn").mkdir()
    (tmp_path / "tileattn" / "__init__.py").write_text("")   # a source checkout's root
    for grid in ("prefill", "mla", "accuracy"):
        shutil.copy(CANONICAL / f"{grid}.json", root / f"{grid}.json")
    monkeypatch.chdir(tmp_path)
    cli.main(["plot"])
    out = capsys.readouterr().out
    for grid in ("prefill", "mla", "accuracy"):
        assert f"{grid}, NVIDIA H100 80GB HBM3" in out
    assert "D=128 causal=True  (TFLOP/s)" in out            # prefill tables
    assert "tileattn-split_dv" in out                        # the MLA table
    assert "fp8e5m2" in out and "RMSE(same in)" in out       # the accuracy table
    assert (root / "prefill.png").stat().st_size > 10_000


def test_plot_markdown_is_the_readme_table(capsys):
    cli.main(["plot", "--markdown", str(CANONICAL / "prefill.json")])
    out = capsys.readouterr().out
    header = out.splitlines()[1]
    assert header.startswith("| D | causal | N | tileattn bf16 |")
    row = next(line for line in out.splitlines() if line.startswith("| 128 | no | 16384 |"))
    result = json.loads(CANONICAL.joinpath("prefill.json").read_text())
    assert result["grid"] == "prefill"
    measured = next(r["tflops"] for r in result["rows"] if (r["D"], r["causal"], r["N"],
                    r["impl"], r["dtype"]) == (128, False, 16384, "tileattn", "bf16"))
    assert f"| {measured:.0f} |" in row   # the committed run's figure, rounded
