"""Compile a kernel launch for any NVIDIA target without a GPU.

A launch is described by the same `KernelLaunch` the launcher runs, built from real (small, CPU)
tensors; this module turns it into the signature, constants and divisibility hints that
Triton's JIT would derive at run time (pointers 16-byte aligned, integer arguments equal to 1
folded to constants, multiples of 16 marked divisible) and compiles it for `sm{capability}`.
The result gives the shared memory the kernel needs and its PTX, so CI can prove a config fits
a chip and uses the instructions we meant.

Must run in a process where TRITON_INTERPRET is unset: interpreted kernels cannot be compiled.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

_POINTER_TYPES = {
    torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32",
    torch.float8_e4m3fn: "*fp8e4nv", torch.float8_e5m2: "*fp8e5", torch.int32: "*i32",
    torch.int64: "*i64", torch.uint8: "*u8",
}


@dataclass
class KernelLaunch:
    kernel: Any                # the @triton.jit function
    grid: tuple[int, ...]
    args: dict[str, Any]       # runtime arguments by name (tensors, ints, floats, None)
    constexprs: dict[str, Any]
    num_warps: int
    num_stages: int

    def run(self) -> None:
        self.kernel[self.grid](**self.args, **self.constexprs,
                               num_warps=self.num_warps, num_stages=self.num_stages)


def on_device(device: torch.device):
    """Make `device` current for a launch, at no host cost when it already is.

    Triton launches on the current CUDA device. `with torch.device(...)` would also do, but it
    installs a TorchFunctionMode that sends every tensor method of the launch path through
    Python (measured: ~15x slower .stride()), so it is avoided.
    """
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


@dataclass
class CompiledKernel:
    shared_bytes: int
    num_regs: int | None
    ptx: str


def cross_compile(launch: KernelLaunch, capability: int) -> CompiledKernel:
    """Compile `launch` for sm_{capability} (e.g. 80, 89, 90) and report its resources."""
    signature: dict[str, str] = {}
    constants: dict[str, Any] = dict(launch.constexprs)
    attrs: dict[tuple[int], list] = {}
    for index, name in enumerate(launch.kernel.arg_names):
        if name in launch.constexprs:
            signature[name] = "constexpr"
            continue
        value = launch.args[name]
        if value is None:
            signature[name] = "constexpr"
            constants[name] = None
        elif isinstance(value, torch.Tensor):
            signature[name] = _POINTER_TYPES[value.dtype]
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            if value == 1:
                signature[name] = "constexpr"
                constants[name] = 1
            else:
                signature[name] = "i32" if -2**31 <= value < 2**31 else "i64"
                if value % 16 == 0:
                    attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"cannot cross-compile argument {name}={value!r}")
    source = ASTSource(fn=launch.kernel, signature=signature, constexprs=constants, attrs=attrs)
    compiled = triton.compile(
        source, target=GPUTarget("cuda", capability, 32),
        options={"num_warps": launch.num_warps, "num_stages": launch.num_stages})
    return CompiledKernel(
        shared_bytes=compiled.metadata.shared,
        num_regs=getattr(compiled, "n_regs", None),
        ptx=compiled.asm["ptx"],
    )
