"""Whether a traced score_mod is `score + c * (q_idx - kv_idx) + d` with c and d depending on
batch, head, captured tensors and constants only (ALiBi's shape, and a bias per head).

The Hopper kernel (kernels/attention/sm90_consumers.py) adds such a mod as two cheap terms
rather than running the hook on every score: its value at each block's first key, once per
row, and c * (first key - key), once per key column of the tile. That splits the same real
number differently, so results differ from the hook's by float32 roundings of terms no larger
than the hook's own.

The proof is symbolic over the graph's aten ops: every node is either free of the score and
the positions (an opaque atom, compared by structure) or a linear combination of score, q_idx,
kv_idx and 1 whose coefficients are polynomials in atoms with rational constants. Anything
else (a product of two position-dependent values, abs, where, a cast to a 16-bit float, an
integer product that could wrap where the float one would not) answers False, and the kernel
runs the hook as written.
"""

from __future__ import annotations

from fractions import Fraction

import torch
import torch.fx

from .emit import HOOK_PARAMETERS

_VARYING = {"score", "q_idx", "kv_idx"}
_PASS_THROUGH = {"_to_copy", "clone", "alias", "detach", "to", "_conj"}
_EXACT_DTYPES = {torch.float32, torch.int32, torch.int64}
# Integer terms stay far from wrapping: positions are below 2**22 (flex/checks.py), so an
# integer combination of them whose constant factors sum to at most this cannot reach 2**31.
_INT_FACTOR_BOUND = 1 << 8

# A polynomial: {monomial (sorted tuple of atom keys): Fraction}; a form: {basis: polynomial},
# basis one of "score", "q_idx", "kv_idx", "1".


def distance_linear(graph_module: torch.fx.GraphModule) -> bool:
    """True when the score_mod graph's result is score + c * (q_idx - kv_idx) + d (module
    docstring)."""
    forms: dict[torch.fx.Node, dict | None] = {}
    varying: dict[torch.fx.Node, bool] = {}
    keys: dict[torch.fx.Node, object] = {}
    placeholders = iter(HOOK_PARAMETERS["score_mod"])   # the traced function's arguments
    result = None
    for node in graph_module.graph.nodes:
        if node.op == "placeholder":
            name = next(placeholders, None)
            varying[node] = name in _VARYING
            keys[node] = name
            forms[node] = {name: {(): Fraction(1)}} if name in _VARYING else _atom(name)
            continue
        if node.op == "output":
            result = node.args[0]
            result = result[0] if isinstance(result, (tuple, list)) else result
            break
        inputs = node.all_input_nodes
        varying[node] = any(varying[n] for n in inputs)
        keys[node] = (getattr(node.target, "__name__", str(node.target)),
                      tuple(_structure(a, keys) for a in node.args),
                      tuple(sorted((k, _structure(v, keys)) for k, v in node.kwargs.items())))
        if node.op == "get_attr":
            forms[node] = None              # a whole captured tensor: only indexing uses it
        else:
            # Free values combine too (-slopes[h] is -1 times the atom slopes[h]).
            forms[node] = _linear_op(node, forms)
            if forms[node] is None and not varying[node]:
                forms[node] = _atom(keys[node])
    if not isinstance(result, torch.fx.Node) or forms.get(result) is None:
        return False
    form = forms[result]
    if result.meta["val"].dtype != torch.float32:
        return False
    if set(form) - {"score", "q_idx", "kv_idx", "1"} or form.get("score") != {(): Fraction(1)}:
        return False
    return _add(form.get("q_idx", {}), form.get("kv_idx", {})) == {}


def _atom(key) -> dict:
    return {"1": {(key,): Fraction(1)}}


def _structure(argument, keys):
    if isinstance(argument, torch.fx.Node):
        return keys[argument]
    if isinstance(argument, (list, tuple)):
        return tuple(_structure(a, keys) for a in argument)
    return repr(argument)


def _operand(argument, forms) -> dict | None:
    if isinstance(argument, torch.fx.Node):
        return forms.get(argument)
    if isinstance(argument, (int, float)) and not isinstance(argument, bool):
        return {"1": {(): Fraction(argument)}}
    return None


def _add(a: dict, b: dict, factor: Fraction = Fraction(1)) -> dict:
    total = dict(a)
    for monomial, value in b.items():
        total[monomial] = total.get(monomial, Fraction(0)) + factor * value
        if total[monomial] == 0:
            del total[monomial]
    return total


def _combine(a: dict, b: dict, factor: Fraction = Fraction(1)) -> dict:
    return {basis: polynomial for basis in set(a) | set(b)
            if (polynomial := _add(a.get(basis, {}), b.get(basis, {}), factor))}


def _times(form: dict, polynomial: dict) -> dict:
    product = {}
    for basis, terms in form.items():
        out = {}
        for m1, v1 in terms.items():
            for m2, v2 in polynomial.items():
                out = _add(out, {tuple(sorted(m1 + m2, key=repr)): v1 * v2})
        if out:
            product[basis] = out
    return product


def _constant_factor(form: dict) -> dict | None:
    """The polynomial of a form free of score and positions, else None."""
    if set(form) - {"1"}:
        return None
    return form.get("1", {})


def _linear_op(node: torch.fx.Node, forms) -> dict | None:
    dtype = node.meta["val"].dtype
    if dtype not in _EXACT_DTYPES:
        return None
    name = getattr(getattr(node.target, "overloadpacket", None), "__name__", str(node.target))
    args = [_operand(a, forms) for a in node.args]
    alpha = node.kwargs.get("alpha", 1)
    if name in _PASS_THROUGH:
        source = node.args[0] if node.args else None
        if (not isinstance(source, torch.fx.Node) or not dtype.is_floating_point
                and source.meta["val"].dtype.is_floating_point):
            return None                 # float -> int truncates
        return _integer_checked(args[0], dtype)
    if name == "neg" and args[0] is not None:
        return _times(args[0], {(): Fraction(-1)})
    if name in ("add", "sub", "rsub") and len(args) == 2 and None not in args:
        a, b = args if name != "rsub" else args[::-1]
        return _integer_checked(_combine(a, b, Fraction(alpha) * (-1 if name != "add" else 1)),
                                dtype)
    if name == "mul" and len(args) == 2 and None not in args:
        for form, other in ((args[0], args[1]), (args[1], args[0])):
            factor = _constant_factor(other)
            if factor is None:
                continue
            return _integer_checked(_times(form, factor), dtype)
        return None
    if name == "div" and len(args) == 2 and None not in args and dtype.is_floating_point:
        if node.kwargs.get("rounding_mode") is not None:
            return None
        divisor = _constant_factor(args[1])
        if divisor is None:
            return None
        if set(divisor) == {()}:
            return _times(args[0], {(): 1 / divisor[()]}) if divisor[()] != 0 else None
        return _times(args[0], {(("reciprocal", repr(sorted(divisor.items()))),): Fraction(1)})
    return None


def _integer_checked(form: dict | None, dtype: torch.dtype) -> dict | None:
    """form, unless it is an integer value whose position terms could wrap around in int32
    (a position factor not a small constant), where the kernel's float terms would not."""
    if form is None or dtype.is_floating_point:
        return form
    factors = [form.get(basis, {}) for basis in ("q_idx", "kv_idx")]
    if any(set(f) - {()} for f in factors):
        return None
    return form if sum(abs(f.get((), 0)) for f in factors) <= _INT_FACTOR_BOUND else None
