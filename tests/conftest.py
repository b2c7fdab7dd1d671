"""Test setup shared by every test file.

CPU-only machines run the real Triton kernels in the interpreter: TRITON_INTERPRET must be set
before any kernel is defined, so it is set here, before tileattn is imported. Where a GPU
exists the kernels compile for it and tests/gpu/ runs too.
"""

import os

import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    # Triton 3.6's interpreter rounds FP8 and bf16 unlike the GPU and cannot multiply bf16:
    # corrected here so that CPU runs check the kernels, not the interpreter's arithmetic.
    from tileattn import interpreter_fixes
    assert interpreter_fixes.apply(), "tests pin triton==3.6.0, whose interpreter this corrects"

# Relative L2 error allowed against the fp64 reference computed on the same (quantized) inputs,
# per input dtype: about twice the worst error measured, on the CPU and on the GPU. FP8 is
# dominated by P being rounded to e4m3 before P@V, for e5m2 inputs too (docs/design.md,
# "Testing").
TOLERANCES = {
    torch.float16: 2e-3,
    torch.bfloat16: 8e-3,
    torch.float8_e4m3fn: 5e-2,
    torch.float8_e5m2: 5e-2,
}

# Bound on |lse - ref| / max(1, |ref|). FP8 QK^T runs on FP8 tensor cores whose fp32
# accumulation keeps fewer mantissa bits, hence the looser row (docs/design.md, "Testing").
LSE_TOLERANCES = {
    torch.float16: 1e-4,
    torch.bfloat16: 1e-4,
    torch.float8_e4m3fn: 2e-3,
    torch.float8_e5m2: 2e-3,
}

# Relative L2 error of dq, dk, dv against fp64 autograd on the same inputs (tests/
# test_attention_bwd.py, tests/gpu/test_attention_bwd_gpu.py): about twice the worst error of
# a same-dtype PyTorch eager backward (scores and P @ V in the dtype, softmax in fp32, as FA3's
# tests' yardstick; backward_helpers.eager_gradients) over tests/test_attention_bwd.py's CASES:
# fp16 6.4e-4, bf16 5.7e-3. The kernels measured at most fp16 3.3e-4, bf16 2.9e-3 there
# (interpreter, CPU), never more than 0.9x the eager error of the same case.
GRAD_TOLERANCES = {
    torch.float16: 1.3e-3,
    torch.bfloat16: 1.1e-2,
}


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true",
                     help="also run the full GPU grid (tests marked `full`); the default GPU "
                          "run is the fast tier")


def pytest_configure(config):
    config.addinivalue_line("markers", "full: part of the full GPU grid, skipped unless --full")


# GPU files whose cases are not tiered one by one: the first FAST_CASES cases of each test
# function form the fast tier (every function, so every feature, still runs), the rest are full.
AUTO_TIERED = ("test_attention_bwd_gpu.py", "test_decode_gpu.py", "test_flex_gpu.py",
               "test_quantize_qkv_gpu.py", "test_flex_sm90.py", "test_attention_sm90_varlen.py")
FAST_CASES = 2


def pytest_collection_modifyitems(config, items):
    if config.getoption("--full"):
        return
    import pytest
    skip = pytest.mark.skip(reason="full GPU grid: run with --full")
    seen: dict[tuple[str, str], int] = {}
    for item in items:
        key = (item.path.name, getattr(item, "originalname", item.name))
        if item.path.name in AUTO_TIERED:
            seen[key] = seen.get(key, 0) + 1
            if seen[key] > FAST_CASES:
                item.add_marker(skip)
        if "full" in item.keywords:
            item.add_marker(skip)
