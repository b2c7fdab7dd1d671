"""What a user's score_mod / mask_mod depends on besides its arguments.

A translated hook is reused for every later call whose function has the same code and closes
over the same kind of values, so that a function re-created each training step (a document
mask over new doc_ids) is not traced again. `captures(fn)` walks everything the function can
reach — closure cells, the globals its code names, defaults, functools.partial arguments,
bound methods and the attributes of plain objects — and returns:

- `signature`: hashable; equal signatures trace to the same graph. Python scalars, strings and
  dtypes count by value; tensors by shape, strides, dtype, device and requires_grad (never by
  contents: the hooks load them at run time); code objects as Python compares them (the
  same code, defined at the same place).
- `tensors`: the tensors reached, in walk order (the same order for equal signatures), with a
  readable name each for error messages ("closure variable 'doc_ids' of document_mask").

What the walk cannot look into (objects with __slots__, C extension objects, containers past
its size limit) enters the signature by identity, so the cache then holds only for the same
objects.
"""

from __future__ import annotations

import dis
import functools
import types
from dataclasses import dataclass, field

import torch

# A function reaching more than this many values is keyed by identity instead (see _Walk.add).
_MAX_VALUES = 2000
_MAX_DEPTH = 12


@dataclass
class Captures:
    signature: tuple
    tensors: list[torch.Tensor] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    # Objects the signature names by id(); a cache keyed on it keeps them alive so that their
    # ids are not reused by other objects.
    keep_alive: list = field(default_factory=list)


def captures(fn) -> Captures:
    walk = _Walk()
    walk.add(fn, _describe(fn), 0)
    if walk.overflowed:
        # Too much to fingerprint: key on the function object itself (its tensors still bind).
        return Captures(("identity", id(fn)), walk.tensors, walk.names, [fn])
    return Captures(tuple(walk.signature), walk.tensors, walk.names, walk.keep_alive)


def function_name(fn) -> str:
    """'name (file.py:12)' for messages."""
    return _describe(fn)


def _describe(fn) -> str:
    target = fn
    while isinstance(target, functools.partial):
        target = target.func
    code = getattr(target, "__code__", None)
    name = getattr(target, "__name__", None) or type(target).__name__
    if code is None:
        return name
    return f"{name} ({code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno})"


@functools.lru_cache(maxsize=4096)
def _global_names(code: types.CodeType) -> tuple[str, ...]:
    """Names the code (and code nested in it) loads from its globals, sorted. Cached: reading
    the bytecode is most of a walk's cost."""
    names = set()
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            names.add(instruction.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.update(_global_names(const))
    return tuple(sorted(names))


_SCALARS = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device,
            torch.layout, torch.memory_format)


def _attributes(value) -> dict | None:
    """An object's attributes from its __dict__ and __slots__; None for objects without
    either (C extension types)."""
    attributes = dict(getattr(value, "__dict__", {}))
    for klass in type(value).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot not in ("__dict__", "__weakref__") and hasattr(value, slot):
                attributes[slot] = getattr(value, slot)
    if not attributes and not hasattr(value, "__dict__"):
        return None
    return attributes


class _Walk:
    def __init__(self):
        self.signature: list = []
        self.tensors: list[torch.Tensor] = []
        self.names: list[str] = []
        self.keep_alive: list = []
        self.seen: dict[int, int] = {}      # id(object) -> position of its first visit
        self.overflowed = False

    def add(self, value, name: str, depth: int) -> None:
        if self.overflowed:
            return
        if len(self.signature) > _MAX_VALUES or depth > _MAX_DEPTH:
            self.overflowed = True
            return
        sig = self.signature
        if isinstance(value, _SCALARS):
            # repr keeps NaN equal to itself and 1 apart from 1.0 and True.
            sig.append((type(value), repr(value)))
            return
        if isinstance(value, torch.Tensor):
            sig.append(("tensor", tuple(value.shape), value.stride(), value.dtype, value.device,
                        value.requires_grad))
            self.tensors.append(value)
            self.names.append(name)
            return
        if id(value) in self.seen:
            sig.append(("seen", self.seen[id(value)]))
            return
        self.seen[id(value)] = len(sig)
        if isinstance(value, types.ModuleType):
            sig.append(("module", value.__name__))
        elif isinstance(value, types.FunctionType):
            self._add_function(value, depth)
        elif isinstance(value, functools.partial):
            sig.append(("partial", len(value.args), tuple(sorted(value.keywords))))
            self.add(value.func, name, depth + 1)
            for i, arg in enumerate(value.args):
                self.add(arg, f"argument {i} of partial {name}", depth + 1)
            for key in sorted(value.keywords):
                self.add(value.keywords[key], f"keyword '{key}' of partial {name}", depth + 1)
        elif isinstance(value, types.MethodType):
            sig.append(("method",))
            self.add(value.__func__, name, depth + 1)
            self.add(value.__self__, f"the object of {name}", depth + 1)
        elif isinstance(value, (tuple, list)):
            sig.append((type(value), len(value)))
            for i, item in enumerate(value):
                self.add(item, f"{name}[{i}]", depth + 1)
        elif isinstance(value, dict):
            keys = list(value)
            if not all(isinstance(key, _SCALARS) for key in keys):
                sig.append(("opaque", dict, id(value)))
                self.keep_alive.append(value)
                return
            sig.append(("dict", tuple(repr(key) for key in keys)))
            for key in keys:
                self.add(value[key], f"{name}[{key!r}]", depth + 1)
        elif isinstance(value, (type, types.BuiltinFunctionType, torch._ops.OpOverload,
                                torch._ops.OpOverloadPacket)):
            sig.append(("builtin", value))
        elif (attributes := _attributes(value)) is not None:
            # A plain object (a config, torch's mask wrapper, an nn.Module): its type and the
            # values of its attributes.
            sig.append(("object", type(value), tuple(attributes)))
            for key, item in attributes.items():
                self.add(item, f"{name}.{key}", depth + 1)
        else:
            sig.append(("opaque", type(value), id(value)))
            self.keep_alive.append(value)

    def _add_function(self, fn: types.FunctionType, depth: int) -> None:
        code = fn.__code__
        label = _describe(fn)
        self.signature.append(("function", code))
        self.add(fn.__defaults__, f"defaults of {label}", depth + 1)
        self.add(fn.__kwdefaults__, f"keyword defaults of {label}", depth + 1)
        for variable, cell in zip(code.co_freevars, fn.__closure__ or ()):
            try:
                content = cell.cell_contents
            except ValueError:        # an empty cell: a variable not assigned yet
                self.signature.append(("empty cell",))
                continue
            self.add(content, f"closure variable '{variable}' of {label}", depth + 1)
        for global_name in _global_names(code):
            if global_name in fn.__globals__:
                self.signature.append(("global", global_name))
                self.add(fn.__globals__[global_name], f"global '{global_name}' of {label}",
                         depth + 1)
