"""The architecture table and the V-layout decision (a pure function of chip and dtype)."""

import pytest
import torch

from tileattn import arch
from tileattn.kernels.attention.fwd import CONFIGS, config_for

FP8 = torch.float8_e4m3fn


@pytest.mark.parametrize("capability,rocm,fp8_k_major", [
    ((8, 0), False, False),   # no FP8 tensor cores
    ((8, 6), False, False),
    ((8, 9), False, True),    # mma.sync: no 8-bit transposing ldmatrix
    ((9, 0), False, True),    # wgmma: 8-bit B must be K-major
    ((10, 0), False, False),  # tcgen05 reads MN-major 8-bit operands
    ((12, 0), False, False),
    ((9, 4), True, False),    # ROCm never
])
def test_v_layout_decision(capability, rocm, fp8_k_major):
    row = arch.arch_for_capability(capability, rocm=rocm)
    assert arch.v_needs_k_major(row, FP8) == fp8_k_major
    assert arch.v_needs_k_major(row, torch.float8_e5m2) == fp8_k_major
    for dtype in (torch.float16, torch.bfloat16):
        assert not arch.v_needs_k_major(row, dtype), "16-bit V never needs a transpose"


def test_shared_memory_per_chip():
    kib = {cap: arch.arch_for_capability(cap).shared_memory_bytes // 1024
           for cap in [(8, 0), (8, 6), (8, 9), (9, 0)]}
    assert kib == {(8, 0): 163, (8, 6): 99, (8, 9): 99, (9, 0): 227}


def test_unknown_minor_inherits_family_and_old_chips_are_refused():
    assert arch.arch_for_capability((9, 1)).name == "sm90"
    with pytest.raises(ValueError, match="8.0 and newer"):
        arch.arch_for_capability((7, 5))


@pytest.mark.parametrize("capability", [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)])
@pytest.mark.parametrize("head_dims", [(64, 64), (96, 96), (128, 128), (192, 128), (256, 256)])
def test_every_chip_has_a_config_for_every_head_dim(capability, head_dims):
    row = arch.arch_for_capability(capability)
    for is_fp8 in ((False, True) if row.has_fp8_mma else (False,)):
        assert config_for(row, *head_dims, is_fp8) in CONFIGS.values()
