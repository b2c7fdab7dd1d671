"""Helpers shared by the integration tests (transformers backend, SDPA's flash slot)."""

from __future__ import annotations

import functools

import torch

# One rounding unit of each half dtype: the slack of the FA3-style yardstick (the error with
# tileattn may be at most twice the error of the framework's own kernel in that dtype, plus this).
ROUNDING_UNIT = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def relative_error(x, reference) -> float:
    """Relative L2 error of x against reference, computed in float64."""
    x, reference = x.double(), reference.double()
    return float((x - reference).norm() / reference.norm())


def counting(function):
    """function with a .calls list recording each call's positional arguments, signature kept."""
    @functools.wraps(function)
    def counted(*args, **kwargs):
        counted.calls.append(args)
        return function(*args, **kwargs)
    counted.calls = []
    return counted
