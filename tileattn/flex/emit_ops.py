"""The aten ops a hook can contain, one handler each (`_op_<aten name>`; ALIASES maps the
other names of an op to its handler). Handlers get the node and its aten arguments and return
a Value (elementwise code) or a View (a captured tensor being indexed)."""

from __future__ import annotations

import math

import torch
import torch.fx

from .emit import TL_DTYPES, EmitterBase, FreshConstant, Value, View, _opmath

_COMPARISONS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_BITWISE = {"bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^",
            "logical_and": "&", "logical_or": "|", "logical_xor": "^"}
# Float functions: the Triton spelling, as torch.compile's flex kernels spell them.
_UNARY = {
    "exp": "tl.exp({0})", "exp2": "tl.exp2({0})", "log": "tl.log({0})", "log2": "tl.log2({0})",
    "sqrt": "hook_ops.sqrt({0})", "rsqrt": "hook_ops.exact_div({one}, hook_ops.sqrt({0}))",
    "tanh": "libdevice.tanh({0})", "sigmoid": "tl.sigmoid({0})", "sin": "tl.sin({0})",
    "cos": "tl.cos({0})", "erf": "tl.erf({0})", "floor": "tl.floor({0})", "ceil": "tl.ceil({0})",
    "trunc": "hook_ops.trunc({0})", "reciprocal": "hook_ops.exact_div({one}, {0})",
}
_NAN_PROPAGATING = ", propagate_nan=tl.PropagateNan.ALL"
# Values an op fills a new tensor with: packet name -> position of the fill value, or the value.
_FILLS = {"full": 1, "scalar_tensor": 0, "full_like": 1, "new_full": 2, "zeros": ("value", 0),
          "ones": ("value", 1), "zeros_like": ("value", 0), "ones_like": ("value", 1),
          "new_zeros": ("value", 0), "new_ones": ("value", 1)}


# x - y OP c  <=>  x - c OP y for int32 values of at most this magnitude (no overflow).
_SMALL_INT = 1 << 29
_MIRRORED = {"eq": "eq", "ne": "ne", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}


def _packet(node: torch.fx.Node) -> str:
    return node.target.overloadpacket.__name__


def _is_power_of_two(value) -> bool:
    return isinstance(value, (int, float)) and value != 0 and math.isfinite(value) and \
        abs(math.frexp(value)[0]) == 0.5


class HookEmitter(EmitterBase):
    ALIASES = {
        "true_divide": "_op_div", "clamp_min": "_op_clamp", "clamp_max": "_op_clamp",
        "sgn": "_op_sign", "bitwise_or": "_op_bitwise_and", "bitwise_xor": "_op_bitwise_and",
        "logical_and": "_op_bitwise_and", "logical_or": "_op_bitwise_and",
        "logical_xor": "_op_bitwise_and", "minimum": "_op_maximum", "select_copy": "_op_select",
        "convert_element_type": "_op__to_copy", "copy": "_op__to_copy",
        "isinf": "_op_isnan", "isposinf": "_op_isnan", "isneginf": "_op_isnan",
        "isfinite": "_op_isnan", "ne": "_op_eq", "lt": "_op_eq", "le": "_op_eq", "gt": "_op_eq",
        "ge": "_op_eq", **{name: "_op_full" for name in _FILLS},
        **{name: "_op_unary" for name in _UNARY},
        # On the 0-d values of a hook, views, copies and reductions change nothing but dtype.
        **{name: "_op_identity" for name in (
            "clone", "alias", "alias_copy", "detach", "detach_copy", "view", "view_copy",
            "_unsafe_view", "reshape", "squeeze", "squeeze_copy", "unsqueeze", "unsqueeze_copy",
            "expand", "expand_copy", "permute", "permute_copy", "contiguous", "positive",
            "sum", "amax", "amin", "mean")},
    }

    # ---- arithmetic -------------------------------------------------------------------------

    def _op_add(self, node, a, b, alpha=1):
        if alpha == 1:
            return self._with_exact_float(self._elementwise(node, "{0} + {1}", a, b),
                                          "{0} + {1}", a, b)
        return self._elementwise(node, "{0} + {1} * {2}", a, b, alpha)

    def _op_sub(self, node, a, b, alpha=1):
        if alpha == 1:
            return self._with_exact_float(self._elementwise(node, "{0} - {1}", a, b),
                                          "{0} - {1}", a, b)
        return self._elementwise(node, "{0} - {1} * {2}", a, b, alpha)

    def _op_rsub(self, node, a, b, alpha=1):
        return self._elementwise(node, "{1} - {0} * {2}", a, b, alpha)

    def _op_mul(self, node, a, b):
        return self._elementwise(node, "{0} * {1}", a, b)

    def _op_div(self, node, a, b, rounding_mode=None):
        out = self._out_dtype(node)
        if rounding_mode is None:
            if _is_power_of_two(b):
                # x * 2^-k is exactly x / 2^k: no division needed.
                return self._elementwise(node, "{0} * {1}", a, 1.0 / b)
            return self._elementwise(node, "hook_ops.exact_div({0}, {1})", a, b, typed=True)
        if rounding_mode == "trunc":
            if out.is_floating_point:
                return self._elementwise(node, "hook_ops.trunc(hook_ops.exact_div({0}, {1}))",
                                         a, b, typed=True)
            return self._elementwise(node, "{0} // {1}", a, b)
        return self._op_floor_divide(node, a, b)

    def _op_floor_divide(self, node, a, b):
        if self._out_dtype(node).is_floating_point:
            return self._elementwise(node, "hook_ops.floor_divide_float({0}, {1})", a, b,
                                     typed=True)
        return self._elementwise(node, "hook_ops.floor_divide_int({0}, {1})", a, b, typed=True)

    def _op_remainder(self, node, a, b):
        helper = "remainder_float" if self._out_dtype(node).is_floating_point else "remainder_int"
        return self._elementwise(node, f"hook_ops.{helper}({{0}}, {{1}})", a, b, typed=True)

    def _op_fmod(self, node, a, b):
        return self._elementwise(node, "{0} % {1}", a, b)

    def _op_neg(self, node, a):
        return self._with_exact_float(self._elementwise(node, "-{0}", a), "-{0}", a)

    def _op_abs(self, node, a):
        return self._with_exact_float(self._elementwise(node, "tl.abs({0})", a),
                                      "tl.abs({0})", a)

    def _op_sign(self, node, a):
        out = self._out_dtype(node)
        if out == torch.bool:
            return self._op_identity(node, a)
        compute = TL_DTYPES[_opmath(out)]
        return self._elementwise(node, f"({{0}} > 0).to({compute}) - ({{0}} < 0).to({compute})",
                                 a)

    def _op_unary(self, node, a):
        name = _packet(node)
        out = self._out_dtype(node)
        if not out.is_floating_point:    # floor/ceil/trunc of an integer: itself
            return self._op_identity(node, a)
        one = f"tl.cast(1.0, {TL_DTYPES[_opmath(out)]})"
        return self._elementwise(node, _UNARY[name].replace("{one}", one), a)

    def _op_relu(self, node, a):
        return self._op_clamp(node, a, 0)

    def _op_pow(self, node, base, exponent):
        out = self._out_dtype(node)
        compute = _opmath(out)
        if isinstance(base, torch.fx.Node) and isinstance(exponent, (int, float)):
            # ATen's pow by a scalar special-cases these exponents the same way.
            if exponent == 0:
                return self._constant(1, out)
            if exponent == 1:
                return self._op_identity(node, base)
            products = {2: "{0} * {0}", 3: "{0} * {0} * {0}"}
            if compute.is_floating_point:
                one = f"tl.cast(1.0, {TL_DTYPES[compute]})"
                products.update({0.5: "hook_ops.sqrt({0})",
                                 -0.5: f"hook_ops.exact_div({one}, hook_ops.sqrt({{0}}))",
                                 -1: f"hook_ops.exact_div({one}, {{0}})",
                                 -2: f"hook_ops.exact_div({one}, {{0}} * {{0}})"})
            elif isinstance(exponent, int) and 0 < exponent <= 8:
                products[exponent] = " * ".join(["{0}"] * exponent)
            if exponent in products:
                return self._elementwise(node, products[exponent], base)
        if not compute.is_floating_point:
            raise self._unsupported(f"integer pow with exponent {exponent!r}")
        return self._elementwise(node, "libdevice.pow({0}, {1})", base, exponent, typed=True)

    def _op_maximum(self, node, a, b):
        function = "tl.maximum" if _packet(node) in ("maximum", "max") else "tl.minimum"
        nan = _NAN_PROPAGATING if _opmath(self._out_dtype(node)).is_floating_point else ""
        return self._elementwise(node, f"{function}({{0}}, {{1}}{nan})", a, b)

    def _op_max(self, node, a, *rest, **kwargs):
        """max(x) of a 0-d value is x; max(x, y) is maximum; max along a dim (values and
        indices) has no meaning on a hook's scalars."""
        overload = node.target._overloadname
        if overload == "default":
            return self._op_identity(node, a)
        if overload == "other":
            return self._op_maximum(node, a, rest[0])
        raise self._unsupported(f"the operation {node.target}")

    _op_min = _op_max

    def _op_clamp(self, node, a, low=None, high=None):
        if _packet(node) == "clamp_max":
            low, high = None, low
        out = self._out_dtype(node)
        compute = _opmath(out)
        nan = _NAN_PROPAGATING if compute.is_floating_point else ""
        value = self._operand(a)
        for bound, function in ((low, "tl.maximum"), (high, "tl.minimum")):
            if bound is not None:
                bound = self._operand(bound)
                value = self._assign(f"{function}({self._cast(value, compute)}, "
                                     f"{self._cast(bound, compute)}{nan})", compute)
        return value if value.dtype == out else self._assign(self._cast(value, out), out)

    # ---- comparisons and logic --------------------------------------------------------------

    def _op_eq(self, node, a, b):
        compute = self._comparison_dtype(a, b)
        name = _packet(node)
        if compute == torch.int32:
            separated = (self._separated_comparison(a, b, name)
                         or self._separated_comparison(b, a, _MIRRORED[name]))
            if separated is not None:
                return separated
        return self._elementwise(node, f"{{0}} {_COMPARISONS[name]} {{1}}", a, b,
                                 compute=compute, predicate=True)

    def _separated_comparison(self, difference, other, name: str) -> Value | None:
        """`(x - y) OP c` emitted as `(x - c) OP y`, where x varies along one of the score's
        axes, y along the other and c along neither (a sliding window's q - kv <= W): the
        compare broadcasts a row against a column, where the difference was an integer op on
        the whole tile, which LLVM's SLP vectorizer packs into bit masks (SASS of a window
        block 1064 -> 801; docs/design.md, "FlexAttention"). Exact: int32 values far from
        overflow either way."""
        if not isinstance(difference, torch.fx.Node) or difference.op != "call_function" or \
                _packet(difference) != "sub" or len(difference.args) != 2 or difference.kwargs:
            return None
        x, y = difference.args
        x_axes, y_axes = self._axes(x), self._axes(y)
        if len(x_axes) != 1 or len(y_axes) != 1 or x_axes == y_axes or self._axes(other):
            return None
        values = [self._operand(v) for v in (x, y, other)]
        if any(v.dtype != torch.int32 or not 0 < v.bound <= _SMALL_INT for v in values[:2]):
            return None
        shift = values[2]
        if shift.is_constant:
            if not (isinstance(shift.constant, int) and not isinstance(shift.constant, bool)
                    and abs(shift.constant) <= _SMALL_INT):
                return None
        elif shift.dtype != torch.int32 or not 0 < shift.bound <= _SMALL_INT:
            return None
        shifted = self._assign(f"{values[0].code} - {self._cast(shift, torch.int32)}",
                               torch.int32)
        return self._assign(f"{shifted.code} {_COMPARISONS[name]} {values[1].code}", torch.bool)

    def _op_bitwise_and(self, node, a, b):
        name = _packet(node)
        compute = torch.bool if name.startswith("logical") else self._out_dtype(node)
        return self._elementwise(node, f"{{0}} {_BITWISE[name]} {{1}}", a, b, compute=compute)

    def _op_logical_not(self, node, a):
        return self._elementwise(node, "~{0}", a, compute=torch.bool)

    def _op_bitwise_not(self, node, a):
        return self._elementwise(node, "~{0}", a)

    def _op_isnan(self, node, a):
        value = self._operand(a)
        name = _packet(node)
        if not value.dtype.is_floating_point:
            return self._constant(name == "isfinite", torch.bool)
        test = {"isnan": "{0} != {0}", "isinf": "tl.abs({0}) == float('inf')",
                "isposinf": "{0} == float('inf')", "isneginf": "{0} == float('-inf')",
                "isfinite": "tl.abs({0}) < float('inf')"}[name]
        return self._elementwise(node, test, a, compute=_opmath(value.dtype), predicate=True)

    def _op_where(self, node, condition, a, b):
        out = self._out_dtype(node)
        compute = _opmath(out)
        test = self._cast(self._operand(condition), torch.bool)
        x, y = (self._cast(self._operand(v), compute) for v in (a, b))
        result = self._assign(f"tl.where({test}, {x}, {y})", compute)
        return result if compute == out else self._assign(self._cast(result, out), out)

    def _op_masked_fill(self, node, a, mask, value):
        return self._op_where(node, mask, value, a)

    # ---- derivatives (from torch.func.grad of a score_mod) ----------------------------------

    def _op_tanh_backward(self, node, grad, tanh):
        return self._elementwise(node, "{0} * (1 - {1} * {1})", grad, tanh)

    def _op_sigmoid_backward(self, node, grad, sigmoid):
        return self._elementwise(node, "{0} * (1 - {1}) * {1}", grad, sigmoid)

    def _op_threshold_backward(self, node, grad, value, threshold):
        return self._elementwise(node, "tl.where({1} <= {2}, 0, {0})", grad, value, threshold)

    # ---- dtypes, constants, views -----------------------------------------------------------

    def _op__to_copy(self, node, *args, **kwargs):
        source = args[1] if _packet(node) == "copy" else args[0]
        return self._op_identity(node, source)

    def _op_identity(self, node, a, *args, **kwargs):
        value = self._operand(a)
        out = self._out_dtype(node)
        if value.dtype == out:
            return value
        if value.is_constant:
            return self._constant(value.constant, out)
        return self._assign(self._cast(value, out), out)

    def _op_full(self, node, *args, **kwargs):
        if node.meta["val"].numel() != 1:
            raise self._unsupported(f"creating a tensor of shape {list(node.meta['val'].shape)} "
                                    f"({node.target})")
        fill = _FILLS[_packet(node)]
        value = fill[1] if isinstance(fill, tuple) else args[fill]
        return self._constant(value, self._out_dtype(node))

    def _op_lift_fresh_copy(self, node, a):
        value = self.values[a]
        if isinstance(value, FreshConstant):
            tensor = value.tensor
            if tensor.numel() != 1:
                raise self._unsupported(
                    f"a tensor of {tensor.numel()} elements created inside the function "
                    "(torch.tensor([...])): create it outside and close over it")
            return self._constant(tensor.item(), tensor.dtype)
        return self._op_identity(node, a)

    def _op_index(self, node, base, indices):
        view = self.values[base]
        if isinstance(view, FreshConstant):
            raise self._unsupported("indexing a tensor created inside the function: create it "
                                    "outside and close over it")
        if not isinstance(view, View):
            raise self._unsupported("indexing a computed value")
        if len(indices) > len(view.shape) - view.indexed_dims:
            raise self._unsupported(f"indexing {view.name} of shape {list(view.shape)} with "
                                    f"{view.indexed_dims + len(indices)} indices")
        for index in indices:
            if index is None:
                raise self._unsupported(f"slicing {view.name} (only indexing by index "
                                        "expressions, along its leading dims)")
            view = self._index_dim(view, self._operand(index))
        return view

    def _op_select(self, node, base, dim, index):
        view = self.values[base]
        if not isinstance(view, View) or dim not in (0, view.indexed_dims - len(view.shape)):
            raise self._unsupported(f"selecting along dim {dim} of a captured tensor")
        return self._index_dim(view, self._constant(index, torch.int64))

    def _index_dim(self, view: View, index: Value) -> View:
        """view indexed along its next dim by `index`: negative indices count from the end,
        indices still outside the dim mark the element as out of bounds (loads 0)."""
        dim = view.indexed_dims
        size, stride = view.shape[dim], view.strides[dim]
        if index.dtype == torch.bool or index.dtype.is_floating_point:
            raise self._unsupported(f"indexing {view.name} by a {index.dtype} tensor")
        if index.is_constant:
            position = index.constant + size if index.constant < 0 else index.constant
            if not 0 <= position < size:
                raise IndexError(f"index {index.constant} is out of bounds for dim {dim} of "
                                 f"{view.name} (size {size}), in {self.label}")
            offset = str(position * stride) if position * stride else None
            return View(view.slot, view.name, view.shape, view.strides, view.dtype,
                        view.offsets + ((offset or "0"),), view.in_bounds)
        if index.nonnegative:       # a position: no wrap-around, only the upper bound
            position = index
            in_bounds = f"({index.code} < {size})"
        else:
            if index.dtype not in (torch.int32, torch.int64):
                index = self._assign(self._cast(index, torch.int32), torch.int32)
            position = self._assign(f"tl.where({index.code} < 0, {index.code} + {size}, "
                                    f"{index.code})", index.dtype)
            in_bounds = f"({position.code} >= 0) & ({position.code} < {size})"
        largest_offset = sum((n - 1) * abs(s) for n, s in zip(view.shape, view.strides))
        widened = (f"{position.code}.to(tl.int64)"
                   if largest_offset >= 2**31 and index.dtype != torch.int64 else position.code)
        offset = "0" if stride == 0 else widened if stride == 1 else f"{widened} * {stride}"
        return View(view.slot, view.name, view.shape, view.strides, view.dtype,
                    view.offsets + (offset,), view.in_bounds + (in_bounds,))

