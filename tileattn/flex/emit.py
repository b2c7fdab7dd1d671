"""Turn a traced mod (trace.py) into the source of a @triton.jit hook (docs: mods.md).

Each graph node becomes one assignment. Values are elementwise: the hook's q_idx [M, 1] and
kv_idx [1, N] (or transposed) broadcast through the ops, batch and head are scalars. Types
follow torch exactly: every node's dtype is read from the trace, operands are cast to the
dtype torch computes in (float16/bfloat16 math in float32, as ATen's CPU kernels do) and the
result to the node's dtype, so Triton's own promotion rules never decide anything.

Ops whose Triton spelling differs from torch's semantics go through hook_ops (floor division,
remainder, IEEE division and square root). exp and log use Triton's fast versions and tanh
libdevice's, as torch.compile's flex kernels do (a few fp32 ulps on the GPU, exact in the
interpreter).

A captured tensor is a `View` until every dim is indexed, then one masked load: a negative
index counts from the end (as torch's indexing does); any index still outside the tensor
loads 0, because hooks also see positions past the sequence ends.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.fx

from .trace import UnsupportedModError

TL_DTYPES = {
    torch.bool: "tl.int1", torch.int8: "tl.int8", torch.uint8: "tl.uint8",
    torch.int16: "tl.int16", torch.int32: "tl.int32", torch.int64: "tl.int64",
    torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16", torch.float32: "tl.float32",
    torch.float64: "tl.float64",
}
HOOK_PARAMETERS = {
    "score_mod": ("score", "batch", "head", "q_idx", "kv_idx", "q_shift", "mod_args"),
    "score_mod_grad": ("score", "batch", "head", "q_idx", "kv_idx", "q_shift", "mod_args"),
    "mask_mod": ("batch", "head", "q_idx", "kv_idx", "q_shift", "mod_args"),
}

_NOT_CONSTANT = object()


# Positions (q_idx, kv_idx: never negative) are below this plus a tile (flex/checks.py refuses
# longer sequences), so hook_ops.position_to_float converts them exactly and index arithmetic
# of magnitude <= 2**24 is exact in float32 (EXACT_FLOAT_BOUND).
POSITION_BOUND = 1 << 22
EXACT_FLOAT_BOUND = 1 << 24


@dataclass(frozen=True)
class Value:
    """An elementwise value of the hook: `code` (a variable or a literal) of torch `dtype`;
    `constant` holds the Python value of a literal. An integer value computed from positions
    by additions, subtractions, negations and absolute values may carry `exact_float`: a float32
    expression of the same value from the positions converted first (a conversion per row and
    per column rather than per score: int-to-float conversions share the special-function
    unit with the softmax's exp2), valid while magnitudes stay within `bound`.

    `nonnegative` marks the positions and program indices: an index by them needs no
    wrap-around nor lower bound check."""
    code: str
    dtype: torch.dtype
    constant: object = _NOT_CONSTANT
    exact_float: str | None = None
    bound: int = 0
    nonnegative: bool = False

    @property
    def is_constant(self) -> bool:
        return self.constant is not _NOT_CONSTANT


@dataclass(frozen=True)
class View:
    """A captured tensor (mod_args[slot]) with its leading `len(offsets)` dims indexed."""
    slot: int
    name: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: torch.dtype
    offsets: tuple[str, ...] = ()
    in_bounds: tuple[str, ...] = ()

    @property
    def indexed_dims(self) -> int:
        return len(self.offsets)


@dataclass(frozen=True)
class FreshConstant:
    """A tensor the function creates itself (torch.tensor(2.0)): its value is part of the code."""
    tensor: torch.Tensor


@dataclass(frozen=True)
class CapturedTensor:
    """What the emitter knows of a captured tensor: where it lives in mod_args, its name for
    messages, and its shape/strides/dtype (baked into the hook)."""
    slot: int
    name: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: torch.dtype


def literal(value, dtype: torch.dtype) -> str:
    """Triton source for the constant `value` as `dtype`. Plain literals are weakly typed in
    Triton (they take the other operand's type); where that could round differently
    (float64, int64, small ints) the constant is made with an explicit type."""
    if dtype == torch.bool:
        return repr(bool(value))
    if dtype.is_floating_point:
        value = float(value)
        text = f"float('{value}')" if not math.isfinite(value) else repr(value)
        return text if dtype == torch.float32 else f"tl.cast({text}, {TL_DTYPES[dtype]})"
    value = int(value)
    if dtype == torch.int32 and -2**31 <= value < 2**31:
        return repr(value)
    return f"tl.cast({value}, {TL_DTYPES[dtype]})"


def _opmath(dtype: torch.dtype) -> torch.dtype:
    """The dtype ATen computes an op of result `dtype` in."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _python_dtype(value) -> torch.dtype:
    if isinstance(value, bool):
        return torch.bool
    if isinstance(value, int):
        return torch.int64
    return torch.float64


class EmitterBase:
    """Emits one hook function from one traced graph; the op handlers (`_op_<aten name>`)
    are in emit_ops.HookEmitter."""

    # aten op packet name -> name of the handler method that emits it
    ALIASES: dict[str, str] = {}

    def __init__(self, graph_module: torch.fx.GraphModule, role: str, function_label: str,
                 captured: dict[str, CapturedTensor], fresh_constants: dict[str, torch.Tensor]):
        self.graph_module = graph_module
        self.role = role
        self.label = f"{role.replace('_grad', '')} {function_label}"
        self.captured = captured                # get_attr target -> CapturedTensor
        self.fresh_constants = fresh_constants  # get_attr target -> tensor the function made
        self.lines: list[str] = []
        self.values: dict[torch.fx.Node, object] = {}
        self.placeholder_names: dict[torch.fx.Node, str] = {}
        self.axes_of: dict[torch.fx.Node, frozenset] = {}
        self.loads: dict[torch.fx.Node, Value] = {}
        self.count = 0

    # ---- entry point ------------------------------------------------------------------------

    def emit(self, function_name: str) -> str:
        parameters = HOOK_PARAMETERS[self.role]
        placeholders = iter(parameters)
        for node in self.graph_module.graph.nodes:
            if node.op == "placeholder":
                name = next(placeholders)
                exact = (f"hook_ops.position_to_float({name})" if name in ("q_idx", "kv_idx")
                         else None)
                self.placeholder_names[node] = name
                self.values[node] = Value(name, node.meta["val"].dtype, exact_float=exact,
                                          bound=POSITION_BOUND, nonnegative=name != "score")
            elif node.op == "get_attr":
                self.values[node] = self._get_attr(node)
            elif node.op == "call_function":
                self.values[node] = self._call(node)
            elif node.op == "output":
                result = node.args[0]
                result = result[0] if isinstance(result, (tuple, list)) else result
                self._return(result)
            else:
                raise self._unsupported(f"FX node {node.op} {node.target}")
        body = "\n".join(f"    {line}" for line in self.lines)
        return (f"@triton.jit\ndef {function_name}({', '.join(parameters)}):\n"
                f"    # {self.label}\n{body}\n")

    # ---- values -----------------------------------------------------------------------------

    def _assign(self, code: str, dtype: torch.dtype) -> Value:
        name = f"v{self.count}"
        self.count += 1
        self.lines.append(f"{name} = {code}")
        return Value(name, dtype)

    def _constant(self, value, dtype: torch.dtype) -> Value:
        if dtype == torch.bool:
            value = bool(value)
        elif dtype.is_floating_point:
            value = float(value)
        else:
            value = int(value)
        return Value(literal(value, dtype), dtype, value)

    def _operand(self, argument) -> Value:
        """A node's argument as an elementwise value (loading a fully indexed captured tensor)."""
        if isinstance(argument, torch.fx.Node):
            value = self.values[argument]
            if isinstance(value, View):
                return self._load(argument, value)
            if isinstance(value, Value):
                return value
            raise self._unsupported(f"using {argument.target} as a value")
        if isinstance(argument, (bool, int, float)):
            return self._constant(argument, _python_dtype(argument))
        raise self._unsupported(f"an argument of type {type(argument).__name__}")

    def _cast(self, value: Value, dtype: torch.dtype, typed: bool = False) -> str:
        """value as `dtype`. typed=True makes constants 0-d tensors (tl.cast) rather than
        Python literals, for helpers that read their operands' dtype."""
        if value.is_constant:
            text = literal(value.constant, dtype)
            if typed and not text.startswith("tl.cast"):
                return f"tl.cast({text}, {TL_DTYPES[dtype]})"
            return text
        if value.dtype == dtype:
            return value.code
        if dtype == torch.float32 and value.exact_float is not None:
            return f"({value.exact_float})"
        if dtype == torch.bool:
            return f"({value.code} != 0)"
        return f"{value.code}.to({TL_DTYPES[dtype]})"

    def _load(self, node: torch.fx.Node, view: View) -> Value:
        if view.indexed_dims != len(view.shape):
            raise self._unsupported(
                f"an operation on the whole captured tensor {view.name} of shape "
                f"{list(view.shape)} (hooks work on one element at a time: index it first, "
                f"e.g. {view.name.split()[-1]}[h] * 2, or precompute it outside)")
        if node not in self.loads:
            pointer = f"mod_args[{view.slot}]"
            offset = " + ".join(o for o in view.offsets if o != "0")
            address = f"{pointer} + {offset}" if offset else pointer
            if view.in_bounds:
                code = f"tl.load({address}, mask={' & '.join(view.in_bounds)}, other=0)"
            else:             # constant indices, checked when translated
                code = f"tl.load({address})"
            self.loads[node] = self._assign(code, view.dtype)
        return self.loads[node]

    # ---- nodes ------------------------------------------------------------------------------

    def _get_attr(self, node: torch.fx.Node):
        if node.target in self.captured:
            tensor = self.captured[node.target]
            return View(tensor.slot, tensor.name, tensor.shape, tensor.strides, tensor.dtype)
        if node.target in self.fresh_constants:
            return FreshConstant(self.fresh_constants[node.target])
        raise self._unsupported(f"the tensor constant {node.target}")

    def _call(self, node: torch.fx.Node):
        target = node.target
        name = getattr(getattr(target, "overloadpacket", None), "__name__", str(target))
        handler = getattr(self, f"_op_{name}", None) or getattr(self, self.ALIASES.get(name, ""),
                                                                  None)
        if handler is None:
            raise self._unsupported(f"the operation {target}")
        folded = self._fold(node)
        if folded is not None:
            return folded
        return handler(node, *node.args, **node.kwargs)

    def _fold(self, node: torch.fx.Node) -> Value | None:
        """An op of constants only, evaluated by torch itself (its exact semantics)."""
        arguments = [a for a in node.args if isinstance(a, torch.fx.Node)]
        if not arguments or not all(isinstance(self.values.get(a), Value)
                                    and self.values[a].is_constant for a in arguments):
            return None

        def real(argument):
            if isinstance(argument, torch.fx.Node):
                value = self.values[argument]
                return torch.tensor(value.constant, dtype=value.dtype)
            return argument
        try:
            result = node.target(*[real(a) for a in node.args], **node.kwargs)
        except Exception:  # noqa: BLE001 - anything torch refuses is emitted as code instead
            return None
        if not isinstance(result, torch.Tensor) or result.numel() != 1:
            return None
        return self._constant(result.item(), result.dtype)

    def _with_exact_float(self, result: Value, template: str, *operands) -> Value:
        """result (an integer op's, template.format(*operands)) with its exact float32 form when
        every operand has one (or is a small integer constant) and magnitudes stay exact."""
        if result.dtype not in (torch.int32, torch.int64):
            return result
        forms, bound = [], 0
        for operand in operands:
            value = self._operand(operand)
            if value.is_constant and isinstance(value.constant, int):
                forms.append(repr(float(value.constant)))
                bound += abs(value.constant)
            elif value.exact_float is not None:
                forms.append(f"({value.exact_float})")
                bound += value.bound
            else:
                return result
        if bound > EXACT_FLOAT_BOUND:
            return result
        return dataclasses.replace(result, exact_float=template.format(*forms), bound=bound)

    def _axes(self, argument) -> frozenset:
        """Which of the score's axes ("q", "kv") a node's value varies along: q_idx and kv_idx
        broadcast along one each, the score along both, batch, head and constants along none."""
        if not isinstance(argument, torch.fx.Node):
            return frozenset()
        if argument not in self.axes_of:
            name = self.placeholder_names.get(argument)
            if name is not None:
                axes = {"q_idx": {"q"}, "kv_idx": {"kv"}, "score": {"q", "kv"}}.get(name, set())
            else:
                axes = set().union(*(self._axes(n) for n in argument.all_input_nodes))
            self.axes_of[argument] = frozenset(axes)
        return self.axes_of[argument]

    def _out_dtype(self, node: torch.fx.Node) -> torch.dtype:
        return node.meta["val"].dtype

    def _elementwise(self, node, template: str, *operands, compute: torch.dtype | None = None,
                     typed: bool = False, predicate: bool = False):
        """Emit template.format(*operands cast to `compute`) — a bool if `predicate`, else of
        dtype `compute` — then cast it to the node's dtype."""
        out = self._out_dtype(node)
        compute = compute or _opmath(out)
        values = [self._operand(o) for o in operands]
        code = template.format(*[self._cast(v, compute, typed) for v in values])
        result = self._assign(code, torch.bool if predicate else compute)
        return result if result.dtype == out else self._assign(self._cast(result, out), out)

    def _comparison_dtype(self, a, b) -> torch.dtype:
        def example(argument):
            if isinstance(argument, torch.fx.Node):
                return torch.empty((), dtype=self._operand(argument).dtype)
            return argument
        return _opmath(torch.result_type(example(a), example(b)))

    def _return(self, result) -> None:
        # The result takes the tile's shape through a select on the index tensors rather than
        # tl.full / tl.broadcast_to, which need a layout in Gluon kernels (the Hopper kernel
        # calls these hooks too); the always-true condition folds away.
        dtype = torch.bool if self.role == "mask_mod" else torch.float32
        value = self._operand(result)
        text = (literal(value.constant, dtype) if value.is_constant
                else self._cast(value, dtype))
        if value.is_constant and not text.startswith("tl.cast"):
            text = f"tl.cast({text}, {TL_DTYPES[dtype]})"
        self.lines.append(f"return tl.where((q_idx == q_idx) & (kv_idx == kv_idx), {text}, {text})")

    def _unsupported(self, what: str) -> UnsupportedModError:
        return UnsupportedModError(
            f"tileattn.flex cannot translate {what}, used by {self.label}. Supported: "
            "arithmetic, comparisons, logical and bitwise ops, torch.where, abs, exp, log, "
            "sqrt, tanh, sigmoid, min/max/clamp, floor division and remainder, pow by a "
            "constant, casts, and indexing captured tensors by index expressions")
