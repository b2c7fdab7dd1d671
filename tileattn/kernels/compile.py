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
from triton.runtime.jit import JITFunction

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
    cubin: bytes = b""         # for cuobjdump -res-usage (registers, spill stack)


def _argument_type(value, path: tuple[int, ...], constants: dict, attrs: dict):
    """The signature entry of one runtime argument as Triton's JIT would specialize it (tuples
    element by element), recording constants and divisibility hints under its path."""
    if value is None or isinstance(value, JITFunction):
        constants[path] = value
        return "constexpr"
    if isinstance(value, tuple):
        return tuple(_argument_type(item, path + (i,), constants, attrs)
                     for i, item in enumerate(value))
    if isinstance(value, torch.Tensor):
        attrs[path] = [["tt.divisibility", 16]]
        return _POINTER_TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        if value == 1:
            constants[path] = 1
            return "constexpr"
        if value % 16 == 0:
            attrs[path] = [["tt.divisibility", 16]]
        return "i32" if -2**31 <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"cannot cross-compile argument {value!r} at {path}")


def cross_compile(launch: KernelLaunch, capability: int) -> CompiledKernel:
    """Compile `launch` for sm_{capability} (e.g. 80, 89, 90) and report its resources."""
    signature: dict[str, Any] = {}
    constants: dict[tuple[int, ...], Any] = {}
    attrs: dict[tuple[int, ...], list] = {}
    for index, name in enumerate(launch.kernel.arg_names):
        if name in launch.constexprs:
            signature[name] = "constexpr"
            constants[(index,)] = launch.constexprs[name]
            continue
        signature[name] = _argument_type(launch.args[name], (index,), constants, attrs)
    source = ASTSource(fn=launch.kernel, signature=signature, constexprs=constants, attrs=attrs)
    compiled = triton.compile(
        source, target=GPUTarget("cuda", capability, 32),
        options={"num_warps": launch.num_warps, "num_stages": launch.num_stages})
    return CompiledKernel(
        shared_bytes=compiled.metadata.shared,
        num_regs=getattr(compiled, "n_regs", None),
        ptx=compiled.asm["ptx"],
        cubin=compiled.asm.get("cubin", b""),
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

    def argument_type(value, path):
        if value is None or isinstance(value, JITFunction):
            constexprs[path] = value
            return "constexpr"
        if isinstance(value, tuple):   # e.g. the hooks' mod_args, element by element
            return tuple(argument_type(item, path + (i,)) for i, item in enumerate(value))
        kind, attr = native_specialize_impl(CUDABackend, value, False, True, True)
        if kind == "constexpr":
            constexprs[path] = value
        if isinstance(attr, str):
            attrs[path] = backend.parse_attr(attr)
        return kind

    for index, name in enumerate(launch.kernel.arg_names):
        if name in launch.constexprs:
            signature[name] = "constexpr"
            constexprs[(index,)] = launch.constexprs[name]
            continue
        signature[name] = argument_type(launch.args[name], (index,))
    source = GluonASTSource(launch.kernel, signature, constexprs, attrs)
    return triton.compile(source, target=target, options={"num_warps": launch.num_warps})
