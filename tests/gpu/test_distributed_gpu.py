"""tileattn.distributed on GPUs: one spawned rank per visible GPU, NCCL (NVLink multicast off:
NCCL_NVLS_ENABLE=0), real sizes, every dtype, both layouts, against single-process
tileattn.attention() and the fp64 reference (tests/gpu/distributed_gpu_cases.py).
Skipped with fewer than two CUDA devices. Run:

    NCCL_NVLS_ENABLE=0 python -m pytest -q tests/gpu/test_distributed_gpu.py
"""

import os

import pytest
import torch

from ..distributed_harness import run_group
from . import distributed_gpu_cases

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")

# Each rank compiles its kernels on first use, and rank 0 runs the fp64 reference at up to
# W x 8k positions; the group must finish within the device tool's 10 minutes.
GROUP_DEADLINE_S = 540


@pytest.fixture(scope="module")
def results(request, tmp_path_factory):
    """The outcomes of the cases this session selected (e.g. with -k), run by one group."""
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    selected = [item.callspec.params["case"] for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")]
    store = tmp_path_factory.mktemp("nccl_group") / "store"
    return run_group(torch.cuda.device_count(), selected, str(store), GROUP_DEADLINE_S,
                     collective_timeout_s=300, device="cuda")


@pytest.mark.parametrize("case", list(distributed_gpu_cases.CASES))
def test_every_rank_passes(results, case):
    failures = [f"rank {rank}: {status}\n{detail}"
                for rank, (status, detail, _) in enumerate(results[case]) if status != "ok"]
    assert not failures, "\n".join(failures)
    notes = [detail for _, detail, _ in results[case] if detail]
    if notes:
        print(f"{case}: {'; '.join(notes)}")
