"""Which forward kernel attention() runs: a pure function of chip, inputs and TILEATTN_KERNEL.
CPU tensors stand in for device tensors (the rule reads only shapes, dtypes and strides)."""

import pytest
import torch

from tileattn.api import kernel_for
from tileattn.arch import arch_for_capability
from tileattn.fp8 import prepare_v

SM90, SM80, SM89, SM100 = (arch_for_capability(c) for c in ((9, 0), (8, 0), (8, 9), (10, 0)))


def inputs(dtype=torch.bfloat16, head_dim=128, seqlen=4096, heads=32):
    """Uninitialised: the rule reads no values. B=1 H=32 N=4096 D=128 is 4x
    attention_sm90_policy.MIN_WORK (2x under a causal mask)."""
    return tuple(torch.empty(1, seqlen, heads, head_dim, dtype=dtype) for _ in range(3))


@pytest.fixture(autouse=True)
def auto(monkeypatch):
    monkeypatch.delenv("TILEATTN_KERNEL", raising=False)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [128, 256])
def test_hopper_kernel_where_it_measured_faster(dtype, head_dim, causal):
    assert kernel_for(SM90, *inputs(dtype, head_dim), causal=causal) == "sm90"
    # B=4 H=32 N=1024 (benchmarks/dispatch_ab.py): the Hopper kernel won through attention()
    # except at D=128 causal, where its host launch outlasts the kernel.
    q, k, v = (torch.empty(4, 1024, 32, head_dim, dtype=dtype) for _ in range(3))
    assert kernel_for(SM90, q, k, v, causal=False) == "sm90"
    assert kernel_for(SM90, q, k, v, causal=True) == ("sm90" if head_dim == 256 else "portable")


@pytest.mark.parametrize("case", ["fp8", "d64", "short", "short-causal", "sm80", "sm89",
                                  "sm100", "misaligned"])
def test_portable_kernel_elsewhere(case):
    arch = {"sm80": SM80, "sm89": SM89, "sm100": SM100}.get(case, SM90)
    q, k, v = inputs(torch.float8_e4m3fn if case == "fp8" else torch.bfloat16,
                     64 if case == "d64" else 128, 2048 if case.startswith("short") else 4096,
                     heads=8 if case.startswith("short") else 32)
    if case == "fp8":
        v = prepare_v(v)
    if case == "misaligned":  # rows of 132 bf16 (264 B): strides TMA cannot address
        q = torch.empty(1, 4096, 32, 132, dtype=torch.bfloat16)[..., :128]
    assert kernel_for(arch, q, k, v, causal=case == "short-causal") == "portable"


@pytest.mark.parametrize("dims", [(192, 128), (96, 96), (192, 192), (128, 64), (64, 256)],
                         ids=lambda d: f"D{d[0]}-Dv{d[1]}")
def test_padded_and_unequal_head_dims_run_here_only_when_forced(dims, monkeypatch):
    """The Hopper kernel takes Dv != D and the padded 96/192 (its tiles pad to powers of two),
    but has not been timed there: attention() keeps them on the portable kernel unless
    TILEATTN_KERNEL=sm90."""
    head_dim, head_dim_v = dims
    q, k = inputs(torch.bfloat16, head_dim)[:2]
    v = torch.empty(1, 4096, 32, head_dim_v, dtype=torch.bfloat16)
    assert kernel_for(SM90, q, k, v, causal=False) == "portable"
    monkeypatch.setenv("TILEATTN_KERNEL", "sm90")
    assert kernel_for(SM90, q, k, v, causal=False) == "sm90"
    q8, k8 = inputs(torch.float8_e4m3fn, head_dim)[:2]
    v8 = prepare_v(torch.empty(1, 4096, 32, head_dim_v, dtype=torch.float8_e4m3fn))
    assert kernel_for(SM90, q8, k8, v8, causal=True) == "sm90"


def test_environment_forces_either_kernel(monkeypatch):
    q, k, v = inputs()
    monkeypatch.setenv("TILEATTN_KERNEL", "portable")
    assert kernel_for(SM90, q, k, v, causal=False) == "portable"
    monkeypatch.setenv("TILEATTN_KERNEL", "sm90")
    assert kernel_for(SM90, q, k, v, causal=True) == "sm90"
    q8, k8, v8 = inputs(torch.float8_e4m3fn)
    assert kernel_for(SM90, q8, k8, prepare_v(v8), causal=False) == "sm90"
    assert kernel_for(SM80, q, k, v, causal=False) == "portable"  # no wgmma: never sm90


def test_bad_environment_value_is_named(monkeypatch):
    monkeypatch.setenv("TILEATTN_KERNEL", "cudnn")
    with pytest.raises(ValueError, match="TILEATTN_KERNEL"):
        kernel_for(SM90, *inputs(), causal=False)
