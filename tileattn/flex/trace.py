"""Trace a score_mod / mask_mod (or score_mod's derivative) into an FX graph of aten ops.

As FlexAttention does, the function runs once on 0-d tensors — score float32, batch, head,
q_idx and kv_idx int32 — and every op it applies is recorded (torch's make_fx). Tracing runs
under fake tensors, so the function never sees a value: Python control flow on a tensor
(`if q_idx > kv_idx:`, `int(q_idx)`, `.item()`) fails here with an error that says so,
instead of baking the traced example's branch into the hook. Indexing a captured tensor by
tensors (`doc_ids[q_idx]`, `bias[h, q_idx - kv_idx]`) is recorded as aten.index, not as
Python indexing with a converted integer. The graph is functional (in-place ops rewritten).

Tensors the function captures appear in the graph as get_attr nodes whose value is the
captured tensor object itself; tensors it creates (`torch.tensor(2.0)`) as get_attr followed
by lift_fresh_copy.
"""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.overrides import TorchFunctionMode

from .closure import function_name

ROLES = ("score_mod", "mask_mod", "score_mod_grad")


class UnsupportedModError(NotImplementedError):
    """A score_mod / mask_mod that tileattn.flex cannot translate into a kernel hook."""


class _IndexWithTensors(TorchFunctionMode):
    """tensor[i, j] with tensor (or int) indices becomes aten.index(tensor, [i, j]), so that a
    0-d index tensor stays symbolic (Python indexing would read its value)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.__getitem__:
            base, index = args
            index = index if isinstance(index, tuple) else (index,)
            if any(isinstance(i, torch.Tensor) for i in index) and all(
                    isinstance(i, (torch.Tensor, int)) and not isinstance(i, bool) for i in index):
                index = [torch.full((), i, dtype=torch.int64) if isinstance(i, int) else i
                         for i in index]
                return torch.ops.aten.index.Tensor(base, index)
        return func(*args, **(kwargs or {}))


def example_inputs(role: str) -> list[torch.Tensor]:
    """The tensors a mod is traced on: score (float32, score mods only), batch, head, q_idx,
    kv_idx (int32), all 0-d, as FlexAttention calls them."""
    indices = [torch.zeros((), dtype=torch.int32) for _ in range(4)]
    if role == "mask_mod":
        return indices
    return [torch.zeros((), dtype=torch.float32)] + indices


def trace(fn, role: str) -> torch.fx.GraphModule:
    """The graph of fn (role "score_mod" or "mask_mod") or of d fn / d score
    (role "score_mod_grad", fn being the score_mod)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    target = torch.func.grad(fn, argnums=0) if role == "score_mod_grad" else fn

    def indexed(*args):
        with _IndexWithTensors():
            return target(*args)

    traced = make_fx(torch.func.functionalize(indexed, remove="mutations_and_views"),
                     tracing_mode="fake", _allow_non_fake_inputs=True)
    try:
        graph_module = traced(*example_inputs(role))
    except (torch.fx.experimental.symbolic_shapes.GuardOnDataDependentSymNode,
            torch._subclasses.fake_tensor.DataDependentOutputException,
            torch._subclasses.fake_tensor.DynamicOutputShapeException) as error:
        raise UnsupportedModError(
            f"{role.replace('_grad', '')} {function_name(fn)} reads the value of a tensor in "
            "Python (an `if`/`while` on a tensor, bool(), int(), float(), .item(), or an op whose "
            "output shape depends on data): a kernel hook cannot branch in Python on data. Use "
            f"torch.where(condition, a, b) and tensor comparisons instead. ({type(error).__name__}: "
            f"{str(error).splitlines()[0]})") from None
    except RuntimeError as error:
        if role == "score_mod_grad" and "does not require grad" in str(error):
            raise UnsupportedModError(
                f"score_mod {function_name(fn)} returns a value that cannot be differentiated "
                f"with respect to score: {error}") from None
        raise
    _drop_shape_only_uses(graph_module.graph)
    graph_module.graph.eliminate_dead_code()
    graph_module.recompile()
    return graph_module


# ops that read only their tensor argument's shape and dtype -> position of the fill value
# (or the value itself)
_FILLED_LIKE = {"ones_like": ("value", 1), "zeros_like": ("value", 0), "full_like": 1,
                "new_ones": ("value", 1), "new_zeros": ("value", 0), "new_full": 2}


def _drop_shape_only_uses(graph: torch.fx.Graph) -> None:
    """Replace ones_like(x) and the like by a constant: a derivative's graph starts from
    ones_like(forward output), which would otherwise keep the whole forward computation (and
    the loads of the tensors it captures) in the derivative hook."""
    for node in list(graph.nodes):
        packet = getattr(node.target, "overloadpacket", None)
        fill = _FILLED_LIKE.get(getattr(packet, "__name__", None))
        if fill is None or node.meta["val"].numel() != 1:
            continue
        value = fill[1] if isinstance(fill, tuple) else node.args[fill]
        with graph.inserting_before(node):
            constant = graph.call_function(torch.ops.aten.full.default, ([], value),
                                           {"dtype": node.meta["val"].dtype})
        constant.meta = dict(node.meta)
        node.replace_all_uses_with(constant)
        graph.erase_node(node)
