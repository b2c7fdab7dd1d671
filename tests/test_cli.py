"""The command line on a machine without a GPU: `bench` refuses with a clear message instead of a
CUDA traceback; `info` describes the CPU path."""

import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only behaviour")


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "tileattn", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("args", [("bench",), ("bench", "--mla")], ids=["prefill", "mla"])
def test_bench_without_a_gpu_says_so(args):
    done = run_cli(*args)
    assert done.returncode == 1
    assert "needs a CUDA GPU" in done.stderr and "Traceback" not in done.stderr


def test_info_on_cpu():
    done = run_cli("info")
    assert done.returncode == 0, done.stderr
    assert "device: CPU" in done.stdout
