"""What both integrations hand to tileattn as it is: fp16/bf16 inputs with tileattn's head dims.
FP8 is each integration's explicit opt-in; everything else stays with the framework's own
attention."""

from __future__ import annotations

from tileattn.arch import FP8_DTYPES
from tileattn.checks import INPUT_DTYPES, SUPPORTED_HEAD_DIMS

HALF_DTYPES = tuple(dtype for dtype in INPUT_DTYPES if dtype not in FP8_DTYPES)

__all__ = ["HALF_DTYPES", "SUPPORTED_HEAD_DIMS"]
