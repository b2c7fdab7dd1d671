"""What the installed tileattn computes, probed at call time.

The integrations hand a call to tileattn only where it computes exactly what was asked, and
give it back to the framework's own implementation otherwise. They probe the public functions'
keywords instead of keeping a version table, so attention_varlen, window_size, softcap and
alibi_slopes are used as soon as tileattn has them.
"""

from __future__ import annotations

import functools
import inspect

import torch

import tileattn
from tileattn.api import SUPPORTED_HEAD_DIMS

# Dtypes the integrations pass through unchanged; FP8 is an explicit opt-in of each integration.
HALF_DTYPES = (torch.float16, torch.bfloat16)

__all__ = ["HALF_DTYPES", "SUPPORTED_HEAD_DIMS", "attention_takes", "has_varlen", "varlen_takes"]


@functools.lru_cache(maxsize=None)
def _keywords(function) -> frozenset[str]:
    try:
        return frozenset(inspect.signature(function).parameters)
    except (TypeError, ValueError):  # a callable without a Python signature takes nothing extra
        return frozenset()


def attention_takes(keyword: str) -> bool:
    """Whether tileattn.attention accepts `keyword` (e.g. "window_size", "softcap")."""
    return keyword in _keywords(tileattn.attention)


def has_varlen() -> bool:
    """Whether tileattn has attention_varlen (packed sequences with cu_seqlens)."""
    return hasattr(tileattn, "attention_varlen")


def varlen_takes(keyword: str) -> bool:
    """Whether tileattn.attention_varlen exists and accepts `keyword`."""
    return has_varlen() and keyword in _keywords(tileattn.attention_varlen)
