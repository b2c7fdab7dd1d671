"""Compile a kernel launch for any NVIDIA target without a GPU (tests and tools, not the
launch path).

A launch is described by the same `KernelLaunch` the launcher runs (kernels/runtime.py), built
from real (small, CPU) tensors; this module turns it into the signature, constants and
divisibility hints that Triton's JIT would derive at run time (pointers 16-byte aligned,
integer arguments equal to 1 folded to constants, multiples of 16 marked divisible) and
compiles it for `sm{capability}`. The result gives the shared memory the kernel needs and its
PTX, so CI can prove a config fits a chip and uses the instructions we meant. cross_compile()
takes Triton kernels; cross_compile_sm90() takes the Gluon (sm90) kernels, typing their
arguments with Triton's own specializer.

Must run in a process where TRITON_INTERPRET is unset: interpreted kernels cannot be compiled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from .runtime import KernelLaunch

_POINTER_TYPES = {
    torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32",
    torch.float8_e4m3fn: "*fp8e4nv", torch.float8_e5m2: "*fp8e5", torch.int32: "*i32",
    torch.int64: "*i64", torch.uint8: "*u8",
}


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


def cross_compile_sm90(launch: KernelLaunch, capability: int = 90):
    """Compile a launch of a Gluon kernel (attention_sm90.py, mla_sm90.py) without a GPU;
    returns triton's CompiledKernel (.asm["ptx"], .asm["cubin"], .metadata.shared). Needs
    TRITON_INTERPRET unset.

    Argument types come from Triton's own specializer, so tensor descriptors and divisibility
    hints are exactly what a launch on the device would compile.
    """
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.experimental.gluon._runtime import GluonASTSource

    target = GPUTarget("cuda", capability, 32)
    backend = CUDABackend(target)
    signature, constexprs, attrs = {}, {}, {}
    for index, name in enumerate(launch.kernel.arg_names):
        value = launch.constexprs[name] if name in launch.constexprs else launch.args[name]
        if name in launch.constexprs or value is None:
            signature[name] = "constexpr"
            constexprs[(index,)] = value
            continue
        kind, attr = native_specialize_impl(CUDABackend, value, False, True, True)
        signature[name] = kind
        if kind == "constexpr":
            constexprs[(index,)] = value
        if isinstance(attr, str):
            attrs[(index,)] = backend.parse_attr(attr)
    source = GluonASTSource(launch.kernel, signature, constexprs, attrs)
    return triton.compile(source, target=target, options={"num_warps": launch.num_warps})
