"""The backward's call cache: a backward whose signature was seen replays its bound
launches (ops/call_cache.py's idea for the forward), skipping the launch setup and Triton's
binder. At short contexts the backward's host time exceeded its kernels' run time (docs/
design.md, "Host overhead and the call cache").

A replay maps each tensor argument of the recorded launches to the same role in the new call
by the argument's name (_ROLES: the names kernels/attention/bwd.py and sm90_bwd.py give
them), after checking, when it records, that every tensor argument is the tensor its name
says. A Gluon TMA descriptor's slot takes the new call's tensor of its role: the bound launch
re-bases its descriptor on it (runtime.BoundLaunch; the signature fixes the descriptor's shape,
strides and alignment, so nothing else of it changes).
"""

from __future__ import annotations

import torch

from ..kernels.attention import bwd
from ..kernels.runtime import KernelLaunch, is_tma_descriptor
from .call_cache import CallCache, tensor_key

# Kernel argument name -> the backward call's tensor it holds (descriptors: _view of it, as
# sm90_bwd._common_args and sm90_bwd_fused make them).
_ROLES = {"q_ptr": "q", "k_ptr": "k", "v_ptr": "v", "out_ptr": "out", "do_ptr": "dout",
          "dlse_ptr": "dlse", "lse_ptr": "lse", "delta_ptr": "delta",
          "dq_accum_ptr": "dq_accum", "dq_ptr": "dq", "dk_ptr": "dk", "dv_ptr": "dv",
          "q_desc": "q", "k_desc": "k", "v_desc": "v", "do_desc": "dout",
          "lse_desc": "lse", "delta_desc": "delta", "dq_desc": "dq_accum",
          "cu_seqlens_q": "cu_seqlens_q", "cu_seqlens_k": "cu_seqlens_k",
          "cu_seqlens_q_ptr": "cu_seqlens_q", "cu_seqlens_k_ptr": "cu_seqlens_k"}

CALLS = CallCache()


def signature(dout, dlse, q, k, v, out, lse, *, causal: bool, softmax_scale: float,
              window_left: int, window_right: int, softcap: float, alibi_slopes,
              deterministic: bool, settings, cu_seqlens_q=None, cu_seqlens_k=None,
              max_seqlen_q: int = 0, max_seqlen_k: int = 0) -> tuple | None:
    """The cache key of a dense or packed (cu_seqlens given; their max lengths set the grid)
    backward call, or None for one it does not take (anything but plain CUDA tensors). The
    softcap's value is not in it: the built-in hooks read it from each call's mod_args."""
    parts = [causal, float(softmax_scale), window_left, window_right, deterministic, settings,
             max_seqlen_q, max_seqlen_k, softcap > 0]
    for x in (dout, dlse, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes):
        key = tensor_key(x, grad_ok=True)
        if key is None:
            return None
        parts.append(key)
    return tuple(parts)


def _view(x: torch.Tensor, role: str) -> torch.Tensor:
    """What a descriptor of this role spans: [B, S, H, D] tensors as [B, H, S, D], packed
    [total, H, D] ones as [1, H, total, D]; lse and delta [B, H, S] as they are, packed
    [H, total] as [1, H, total]."""
    if role in ("lse", "delta"):
        return x if x.dim() == 3 else x.unsqueeze(0)
    return (x if x.dim() == 4 else x.unsqueeze(0)).permute(0, 2, 1, 3)


def _argument_plan(launch: KernelLaunch, tensor_names, call: dict) -> dict | None:
    """name -> how a replay fills it: ("tensor", role), ("descriptor", role) (the bound launch
    re-bases its descriptor on that tensor), ("mod_args",) or ("fixed", value) for other
    tensor-free tuples; None where an argument is not what _ROLES says."""
    plan = {}
    for name in tensor_names:
        value = launch.args.get(name)
        role = _ROLES.get(name)
        if name == "mod_args":
            # The built-in hooks' arguments (kernels/mods.builtin: the softcap, the slopes and
            # their strides): each replay passes its call's.
            recorded = call.get("mod_args", ())
            if len(value) != len(recorded) or any(a is not b and a != b
                                                  for a, b in zip(value, recorded)):
                return None
            plan[name] = ("mod_args",)
        elif type(value) is tuple:
            if any(isinstance(item, torch.Tensor) for item in value):
                return None
            plan[name] = ("fixed", value)
        elif role is None or call.get(role) is None:
            return None
        elif is_tma_descriptor(value):
            view = _view(call[role], role)
            if (value.base.data_ptr() != view.data_ptr() or value.base.shape != view.shape
                    or value.base.stride() != view.stride()):
                return None
            plan[name] = ("descriptor", role)
        elif value is call[role]:
            plan[name] = ("tensor", role)
        else:
            return None
    return plan


def make_replay(launches: list[KernelLaunch], call: dict, deterministic: bool):
    """A replay(dout, dlse, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, mod_args) -> (dq,
    dk, dv) of launches that have run for
    the tensors in `call` (role -> tensor), or None where one cannot be bound or mapped."""
    steps = []
    for launch in launches:
        bound = launch.bind()
        if bound is None:
            return None
        plan = _argument_plan(launch, bound.tensor_names, call)
        if plan is None:
            return None
        steps.append((bound, plan))

    def replay(dout, dlse, q, k, v, out, lse, cu_seqlens_q=None, cu_seqlens_k=None,
               mod_args=()):
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        delta, dq_accum = bwd.backward_workspace(q, lse, deterministic)
        roles = dict(q=q, k=k, v=v, out=out, lse=lse, dout=dout, dlse=dlse, dq=dq, dk=dk,
                     dv=dv, delta=delta, dq_accum=dq_accum, cu_seqlens_q=cu_seqlens_q,
                     cu_seqlens_k=cu_seqlens_k)
        for bound, plan in steps:
            values = {}
            for name, entry in plan.items():
                if entry[0] in ("tensor", "descriptor"):
                    values[name] = roles[entry[1]]
                elif entry[0] == "mod_args":
                    values[name] = mod_args
                else:
                    values[name] = entry[1]
            bound.run(**values)
        return dq, dk, dv
    return replay

