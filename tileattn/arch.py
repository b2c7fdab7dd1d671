"""Every architecture fact tileattn relies on, in one table.

Kernels read their tile configs from their own config tables; this module only says what a
chip *is*: how much shared memory one program may use, whether it has FP8 tensor cores, and
whether an FP8 ``P @ V`` product needs V stored K-major.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Arch:
    name: str                  # key into the kernels' config tables ("sm80", "sm90", "rocm", ...)
    capability: tuple[int, int] | None
    shared_memory_bytes: int   # opt-in shared memory per program (per thread block)
    has_fp8_mma: bool          # FP8 tensor-core instructions exist
    fp8_v_needs_k_major: bool  # FP8 P@V must read V with the sequence dim contiguous
    has_wgmma: bool            # Hopper warpgroup MMA (wgmma / HGMMA / QGMMA in SASS)


# Why fp8_v_needs_k_major:
#  * sm90: FP8 wgmma takes its B operand from shared memory and accepts only K-major layouts for
#    8-bit types. With V row-major (head_dim contiguous) the compiler must transpose every V tile
#    through registers, which stops the asynchronous (TMA / cp.async) pipeline of V loads.
#  * sm89 (and sm86/sm80 have no FP8 MMA at all): mma.sync fetches B fragments with ldmatrix,
#    whose transposing form works on 16-bit elements only, so 8-bit V must already be K-major.
#  * sm100+: tcgen05 MMA reads MN-major 8-bit operands from shared memory, no transpose needed.
#  * ROCm: the MFMA path loads V through registers either way; never transpose there.
_TABLE = {
    (8, 0): Arch("sm80", (8, 0), 163 * 1024, False, False, False),
    (8, 6): Arch("sm86", (8, 6), 99 * 1024, False, False, False),
    (8, 7): Arch("sm87", (8, 7), 163 * 1024, False, False, False),
    (8, 9): Arch("sm89", (8, 9), 99 * 1024, True, True, False),
    (9, 0): Arch("sm90", (9, 0), 227 * 1024, True, True, True),
    (10, 0): Arch("sm100", (10, 0), 227 * 1024, True, False, False),
    (12, 0): Arch("sm120", (12, 0), 99 * 1024, True, False, False),
}

ROCM = Arch("rocm", None, 64 * 1024, True, False, False)
# CPU tensors run the kernel in the Triton interpreter (or the reference); no layout rules apply.
CPU = Arch("cpu", None, 1 << 30, True, False, False)


def arch_for_capability(capability: tuple[int, int], *, rocm: bool = False) -> Arch:
    """The table row for a CUDA compute capability (ROCm devices all share one row)."""
    if rocm:
        return ROCM
    if capability in _TABLE:
        return _TABLE[capability]
    major, _ = capability
    # Unknown minor revisions inherit their family's row; unknown families are refused rather
    # than guessed, because a wrong shared-memory size turns into a launch failure.
    same_family = [row for cap, row in _TABLE.items() if cap[0] == major]
    if same_family:
        return min(same_family, key=lambda row: row.shared_memory_bytes)
    if major > 12:
        return _TABLE[(12, 0)]
    raise ValueError(f"tileattn supports compute capability 8.0 and newer, got {capability}")


def arch_of(device: torch.device) -> Arch:
    if device.type != "cuda":
        return CPU
    return _cuda_arch(torch._C._cuda_getDevice() if device.index is None else device.index)


@functools.lru_cache(maxsize=None)
def _cuda_arch(index: int) -> Arch:
    # Once per GPU: reading the capability cost ~11 us of every backward call's host time
    # (H100 host; docs/design.md, "Host overhead and the call cache").
    if torch.version.hip is not None:
        return ROCM
    return arch_for_capability(torch.cuda.get_device_capability(index))


def v_needs_k_major(arch: Arch, dtype: torch.dtype) -> bool:
    """Whether attention() must hand the kernel a K-major V for this chip and dtype."""
    return arch.fp8_v_needs_k_major and dtype in FP8_DTYPES


FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 8
    return torch.cuda.get_device_properties(device).multi_processor_count
