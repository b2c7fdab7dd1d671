"""The launch runtime: how every tileattn kernel is launched, fast.

A `KernelLaunch` describes one launch (kernel, grid, runtime arguments, constexprs, warps and
stages). `run()` launches it; on CUDA a repeat launch of an already compiled specialization
skips Triton's binder and calls the compiled kernel's launcher directly, because the binder's
host cost exceeds a short kernel's run time (docs/design.md, "Host overhead and the call
cache"). `bind()` turns a
launch into a `BoundLaunch` whose tensors are given per call, for the call caches of the ops.
The same `KernelLaunch` is what `kernels/compile.py` cross-compiles without a GPU.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import triton
from triton import knobs
from triton.knobs import HookChain
from triton.runtime.interpreter import InterpretedFunction

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
        binder and go straight to the compiled kernel's launcher (module docstring)."""
        if not _fast_launch_possible(self.kernel):
            with _interpreter_corrections(self.kernel):
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
        compiled.run(grid[0], grid[1], grid[2], current_stream_handle(),
                     compiled.function, compiled.packed_metadata, None, None, None, *ordered)

    def _specialization_key(self, ordered: list) -> tuple:
        """Everything Triton's JIT specializes a compiled kernel on (see kernels/compile.py):
        constexprs by value; runtime arguments by _value_key. Runs on every launch."""
        key = [self.kernel, self.num_warps, self.num_stages, torch._C._cuda_getDevice()]
        constexprs = self.constexprs
        for name, value in zip(self.kernel.arg_names, ordered):
            key.append(value if name in constexprs else _value_key(value))
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


def _value_key(value):
    """What Triton specializes a runtime argument on: tensors by dtype and 16-byte alignment;
    ints by ==1, %16 and 32-bit range; floats by type; tuples element by element. Dispatches
    on exact types first: this runs for every argument of every launch."""
    kind = type(value)
    if kind is int:
        return (value == 1, value % 16 == 0, -2**31 <= value < 2**31)
    if kind is float:
        return float
    if kind is bool or value is None:
        return value
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.data_ptr() % 16 == 0)
    if kind is tuple:
        return tuple(_value_key(item) for item in value)
    if isinstance(value, int):
        return (value == 1, value % 16 == 0, -2**31 <= value < 2**31)
    if hasattr(value, "block_shape") and hasattr(value, "layout"):
        # A Gluon TMA descriptor: Triton specializes it on exactly these (its specialization
        # string is tensordesc<dtype[block_shape],layout>, no attributes).
        return (kind, value.base.dtype, tuple(value.block_shape), value.layout)
    return kind


def is_tma_descriptor(value) -> bool:
    """A Gluon host TMA descriptor (it holds its tensor, as `base`)."""
    return hasattr(value, "block_shape") and hasattr(value, "layout") and hasattr(value, "base")


def rebased_descriptor(descriptor, base: torch.Tensor | None):
    """A host TMA descriptor like `descriptor` over `base` instead (None: a template that holds
    no tensor), made without the constructor's checks, which are most of its host time. Its
    launch reads only base's data pointer (the descriptor keeps its own shape and strides), so
    base may be any tensor starting there, e.g. the unpermuted tensor of a permuted view."""
    new = object.__new__(type(descriptor))
    new.__dict__.update(descriptor.__dict__)
    new.base = base
    return new


def _holds_tensor(value) -> bool:
    if isinstance(value, torch.Tensor) or is_tma_descriptor(value):
        return True
    return type(value) is tuple and any(_holds_tensor(item) for item in value)


class BoundLaunch:
    """A compiled launch whose tensor arguments (and TMA descriptors, which hold tensors) are
    given per call (see KernelLaunch.bind). It keeps no tensor of the call it was made from;
    every tensor slot must be filled. A descriptor slot takes a descriptor, or the tensor to
    re-base the launch's descriptor on (its shape, strides and box stay the launch's: a call
    cache's signature fixes them)."""

    def __init__(self, compiled, grid: tuple[int, int, int], ordered: list, names: list[str]):
        self.compiled = compiled
        self.grid = grid
        # Tensors and tuples (hook arguments: tensors and scalars) are given by every call.
        self.tensor_names = frozenset(name for name, value in zip(names, ordered)
                                      if _holds_tensor(value) or type(value) is tuple)
        self.ordered = [None if name in self.tensor_names else value
                        for name, value in zip(names, ordered)]
        self.index = {name: i for i, name in enumerate(names)}
        self.descriptor_templates = {name: rebased_descriptor(value, None)
                                     for name, value in zip(names, ordered)
                                     if is_tma_descriptor(value)}
        self.direct = DirectLaunch.create(compiled, grid, ordered, names, self.tensor_names)

    def run(self, **values) -> None:
        if not self.tensor_names <= values.keys():
            raise TypeError(f"BoundLaunch.run needs every tensor of its launch: "
                            f"missing {sorted(self.tensor_names - values.keys())}")
        if self.direct is not None:
            self.direct.run(current_stream_handle(), values)
            return
        args = list(self.ordered)
        for name, value in values.items():
            if name in self.descriptor_templates and isinstance(value, torch.Tensor):
                value = rebased_descriptor(self.descriptor_templates[name], value)
            args[self.index[name]] = value
        compiled = self.compiled
        compiled.run(self.grid[0], self.grid[1], self.grid[2], current_stream_handle(),
                     compiled.function, compiled.packed_metadata, None, None, None, *args)


class _DescriptorSlot(NamedTuple):
    """How DirectLaunch fills a descriptor argument: `width` entries of the C launcher's list,
    a CUtensorMap (fill_tma_descriptor(address, *map_fields)) then the launch's shape and
    strides; `meta` is Triton's tensordesc metadata for descriptors given as descriptors."""
    meta: dict
    width: int
    map_fields: tuple
    shape_and_strides: list


class DirectLaunch:
    """A bound launch's call of Triton's C launcher with the argument list built once.

    Triton 3.6's CudaLauncher rebuilds the C launcher's list on every launch, expanding each
    TMA descriptor into its CUtensorMap, shape and strides (triton/backends/nvidia/driver.py,
    wrap_handle_tensordesc); that Python work is a good part of a short call's host time
    (docs/design.md, "Host overhead and the call cache"). A bound launch changes only its
    tensors and scalars, so the list is built once and a call writes its values into their
    slots, a descriptor as Triton's own make_tensordesc_arg expands it, a tensor given for a
    descriptor as the launch's descriptor re-based on it (a CUtensorMap filled for the new
    address, the launch's shape and strides). `create` returns None where the launcher is not
    laid out as Triton 3.6's (another Triton, scratch buffers, a stand-in): BoundLaunch then
    takes CudaLauncher's own path."""

    def __init__(self, raw_launch, expand, fill, template: list, slots: dict,
                 descriptors: dict):
        self.raw_launch = raw_launch
        self.expand = expand            # Triton's make_tensordesc_arg
        self.fill = fill                # the driver's fill_tma_descriptor
        self.template = template        # the C launcher's arguments, the stream at index 3
        self.slots = slots              # argument name -> index in template
        self.descriptors = descriptors  # descriptor argument name -> _DescriptorSlot

    @staticmethod
    def create(compiled, grid, ordered: list, names: list[str], given: frozenset):
        from triton.backends.nvidia import driver as nvidia

        launcher = getattr(compiled, "run", None)
        if (type(launcher) is not nvidia.CudaLauncher or launcher.global_scratch_size
                or launcher.profile_scratch_size):
            return None
        launch = launcher.launch
        if getattr(launch, "__qualname__", "") == "wrap_handle_tensordesc.<locals>.inner":
            cells = dict(zip(launch.__code__.co_freevars,
                             (cell.cell_contents for cell in launch.__closure__)))
            raw_launch = cells.get("launcher")
            indices = sorted(cells.get("tensordesc_indices", ()))
            metas = cells.get("tensordesc_meta") or ()
            if raw_launch is None or len(metas) != len(indices) or None in metas:
                return None
        else:
            raw_launch, indices, metas = launch, [], ()
        meta_at = dict(zip(indices, metas))
        template = [*grid, None, compiled.function, launcher.launch_cooperative_grid,
                    launcher.launch_pdl, None, None, compiled.packed_metadata, None, None, None]
        if len(template) != nvidia._BASE_ARGS_FORMAT_LEN:
            return None
        slots, descriptors = {}, {}
        for i, (name, value) in enumerate(zip(names, ordered)):
            slots[name] = len(template)
            if i in meta_at:
                meta = meta_at[i]
                expanded = nvidia.make_tensordesc_arg(value, meta)
                shape_and_strides = expanded[1:]
                map_fields = (meta["swizzle"], meta["elem_size"],
                              nvidia.TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]],
                              meta["block_size"], list(shape_and_strides[:len(value.shape)]),
                              list(value.strides), 1 if value.padding == "nan" else 0)
                descriptors[name] = _DescriptorSlot(meta, len(expanded), map_fields,
                                                    shape_and_strides)
                template.extend(expanded)
            else:
                template.append(value)
        for name in given:      # the first call's tensors are not kept
            width = descriptors[name].width if name in descriptors else 1
            template[slots[name]:slots[name] + width] = [None] * width
        fill = triton.runtime.driver.active.utils.fill_tma_descriptor
        return DirectLaunch(raw_launch, nvidia.make_tensordesc_arg, fill, template, slots,
                            descriptors)

    def run(self, stream: int, values: dict) -> None:
        args = self.template.copy()
        args[3] = stream
        for name, value in values.items():
            slot = self.slots[name]
            descriptor = self.descriptors.get(name)
            if descriptor is None:
                args[slot] = value
                continue
            if isinstance(value, torch.Tensor):
                expanded = [self.fill(value.data_ptr(), *descriptor.map_fields),
                            *descriptor.shape_and_strides]
            else:
                expanded = self.expand(value, descriptor.meta)
            if len(expanded) != descriptor.width:
                raise ValueError(f"BoundLaunch.run: {name} has {len(value.shape)} dims, not "
                                 f"the {(descriptor.width - 1) // 2} of its launch's descriptor")
            args[slot:slot + descriptor.width] = expanded
        self.raw_launch(*args)


def current_stream_handle() -> int:
    """The current CUDA stream of the current device as a raw handle (what Triton's launcher
    takes; the capturing stream under CUDA graph capture). torch.cuda.current_stream() builds
    a Stream object first: ~8 us against ~0.3 us a launch on the H100 host."""
    return torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())


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


def _interpreter_corrections(kernel):
    """Triton's CPU interpreter mis-rounds FP8 and bf16 and cannot multiply bf16; tileattn's
    interpreted launches run with interpreter_fixes' corrections, installed for the launch only."""
    if isinstance(kernel, InterpretedFunction):
        from .. import interpreter_fixes
        return interpreter_fixes.corrected()
    return contextlib.nullcontext()


def on_device(device: torch.device):
    """Make `device` current for a launch, at no host cost when it already is.

    Triton launches on the current CUDA device. `with torch.device(...)` would also do, but it
    installs a TorchFunctionMode that sends every tensor method of the launch path through
    Python, many times slower (docs/design.md, "Host overhead and the call cache").
    """
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()




@triton.jit
def _interpreter_probe():
    pass


def interpreter_active() -> bool:
    """True when TRITON_INTERPRET=1 was set before tileattn's kernels were defined (Triton
    decides at decoration time whether a @triton.jit function is interpreted)."""
    return isinstance(_interpreter_probe, InterpretedFunction)
