"""The call cache: later calls with the same signature skip the checks and the launch setup.

A signature holds everything the checks and the launch read besides tensor contents and
scalar values: shapes, strides, dtypes, devices, 16-byte alignment, flags and the kernel
settings in force. The host cost of checks plus Triton's launch path exceeds a short kernel's
run time (docs/design.md, "Host overhead and the call cache"), so repeat calls replay bound
launches instead.
"""

from __future__ import annotations

import torch

_MAX_ENTRIES = 1024


def tensor_key(x, grad_ok: bool = False):
    """The part of a signature one tensor argument contributes; None for a value the cache
    does not take (anything but a plain CUDA tensor that does not require grad; grad_ok: that
    may, as the backward's saved inputs do)."""
    if x is None:
        return ()
    if type(x) is torch.Tensor and x.is_cuda and (grad_ok or not x.requires_grad):
        return (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() % 16)
    return None


class CallCache:
    """signature -> replay function. Bounded: cleared when full (signatures are few in
    practice: one per layer shape)."""

    def __init__(self):
        self._entries: dict[tuple, object] = {}
        _ALL.append(self)

    def get(self, signature):
        return self._entries.get(signature) if signature is not None else None

    def put(self, signature, replay) -> None:
        if signature is None or replay is None:
            return
        if len(self._entries) >= _MAX_ENTRIES:
            self._entries.clear()
        self._entries[signature] = replay

    def clear(self) -> None:
        self._entries.clear()


# Every call cache, for clear_all.
_ALL: list[CallCache] = []


def clear_all() -> None:
    """Forget every bound launch of every call cache. A replay runs the kernel its signature
    was first compiled with: whoever changes what the launchers read besides the signature
    (a kernel setting toggled between the variants of an A/B) clears them first."""
    for cache in _ALL:
        cache.clear()


_UNIT_DESCALES: dict[torch.device, torch.Tensor] = {}


def unit_descale(device: torch.device) -> torch.Tensor:
    """A float32 1.0 on device, made once (never handed to the caller, never written): what a
    kernel reads for a missing FP8 descale. Not kept when made during a CUDA graph capture,
    where a new tensor is only filled when the graph replays."""
    one = _UNIT_DESCALES.get(device)
    if one is None:
        one = torch.ones((), dtype=torch.float32, device=device)
        if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
            _UNIT_DESCALES[device] = one
    return one
