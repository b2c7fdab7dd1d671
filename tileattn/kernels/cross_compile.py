"""Compile a kernel launch for any NVIDIA target without a GPU.

A launch is described by the same `KernelLaunch` the launcher runs, built from real (small, CPU)
tensors; this module turns it into the signature, constants and divisibility hints that
Triton's JIT would derive at run time (pointers 16-byte aligned, integer arguments equal to 1
folded to constants, multiples of 16 marked divisible) and compiles it for `sm{capability}`.
The result gives the shared memory the kernel needs and its PTX, so CI can prove a config fits
a chip and uses the instructions we meant. cross_compile() takes Triton kernels;
cross_compile_sm90() takes the Gluon (sm90) kernels, typing their arguments with Triton's own
specializer.

Must run in a process where TRITON_INTERPRET is unset: interpreted kernels cannot be compiled.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton import knobs
from triton.knobs import HookChain
from triton.compiler import ASTSource
from triton.runtime.interpreter import InterpretedFunction

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
        """Launch. On CUDA, repeat launches of an already-compiled specialization skip Triton's
        binder and go straight to the compiled kernel's launcher: on the lent H100's host that
        binder costs ~60 us a call, more than a whole N=1024 forward."""
        if not _fast_launch_possible(self.kernel):
            self.kernel[self.grid](**self.args, **self.constexprs,
                                   num_warps=self.num_warps, num_stages=self.num_stages)
            return
        ordered = [self.constexprs[name] if name in self.constexprs else self.args[name]
                   for name in self.kernel.arg_names]
        key = self._specialization_key(ordered)
        compiled = _COMPILED.get(key)
        if compiled is None:
            _COMPILED[key] = self.kernel[self.grid](**self.args, **self.constexprs,
                                                    num_warps=self.num_warps,
                                                    num_stages=self.num_stages)
            return
        grid = (*self.grid, 1, 1)
        compiled.run(grid[0], grid[1], grid[2], torch.cuda.current_stream().cuda_stream,
                     compiled.function, compiled.packed_metadata, None, None, None, *ordered)

    def _specialization_key(self, ordered: list) -> tuple:
        """Everything Triton's JIT specializes a compiled kernel on (see cross_compile below):
        constexprs by value; tensors by dtype and 16-byte alignment; ints by ==1, %16 and
        32-bit range. Dispatches on exact types first: this runs on every launch."""
        key = [self.kernel, self.num_warps, self.num_stages, torch.cuda.current_device()]
        constexprs = self.constexprs
        for name, value in zip(self.kernel.arg_names, ordered):
            kind = type(value)
            if kind is int and name not in constexprs:
                key.append((value == 1, value % 16 == 0, -2**31 <= value < 2**31))
            elif kind is float:
                key.append(float)
            elif kind is bool or value is None or name in constexprs:
                key.append(value)
            elif isinstance(value, torch.Tensor):
                key.append((value.dtype, value.data_ptr() % 16 == 0))
            elif isinstance(value, int):
                key.append((value == 1, value % 16 == 0, -2**31 <= value < 2**31))
            elif hasattr(value, "block_shape") and hasattr(value, "layout"):
                # A Gluon TMA descriptor: Triton specializes it on exactly these (its
                # specialization string is tensordesc<dtype[block_shape],layout>, no attributes).
                key.append((kind, value.base.dtype, tuple(value.block_shape), value.layout))
            else:
                key.append(kind)
        return tuple(key)


    def bind(self) -> "BoundLaunch | None":
        """This launch with its tensors left open, for calls that differ from it only in
        tensors of the same dtype and alignment (and float scalars); None where the fast path
        does not apply or the specialization is not compiled yet (run() once first)."""
        if not _fast_launch_possible(self.kernel):
            return None
        ordered = [self.constexprs[name] if name in self.constexprs else self.args[name]
                   for name in self.kernel.arg_names]
        compiled = _COMPILED.get(self._specialization_key(ordered))
        if compiled is None:
            return None
        return BoundLaunch(compiled, (*self.grid, 1, 1)[:3], ordered, self.kernel.arg_names)


class BoundLaunch:
    """A compiled launch whose tensor arguments are given per call (see KernelLaunch.bind).
    It keeps no tensor of the call it was made from; every tensor slot must be filled."""

    def __init__(self, compiled, grid: tuple[int, int, int], ordered: list, names: list[str]):
        self.compiled = compiled
        self.grid = grid
        self.tensor_names = frozenset(name for name, value in zip(names, ordered)
                                      if isinstance(value, torch.Tensor))
        self.ordered = [None if name in self.tensor_names else value
                        for name, value in zip(names, ordered)]
        self.index = {name: i for i, name in enumerate(names)}

    def run(self, **values) -> None:
        if not self.tensor_names <= values.keys():
            raise TypeError(f"BoundLaunch.run needs every tensor of its launch: "
                            f"missing {sorted(self.tensor_names - values.keys())}")
        args = list(self.ordered)
        for name, value in values.items():
            args[self.index[name]] = value
        compiled = self.compiled
        compiled.run(self.grid[0], self.grid[1], self.grid[2],
                     torch.cuda.current_stream().cuda_stream, compiled.function,
                     compiled.packed_metadata, None, None, None, *args)


# Compiled kernels by specialization key, for KernelLaunch.run's fast path.
_COMPILED: dict[tuple, Any] = {}


def launch_hooks_clear() -> bool:
    """No profiler or user hook watches Triton's launches (bound launches would bypass it).
    Triton keeps its launch hooks as (usually empty) HookChains, or a user's function."""
    return all(hook is None or (isinstance(hook, HookChain) and not hook.calls)
               for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook))


def _fast_launch_possible(kernel) -> bool:
    # Interpreted kernels, and launches watched by hooks (profilers), take Triton's own path.
    return (not isinstance(kernel, InterpretedFunction) and torch.cuda.is_available()
            and launch_hooks_clear())


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
    cubin: bytes = b""         # for cuobjdump -res-usage (registers, spill stack)


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
