"""tileattn: fused attention kernels in Triton for LLM training and serving."""

from .api import PerformanceWarning, attention, mla_decode, mla_plan
from .decode import decode_plan, paged_decode
from .fp8 import prepare_v, quantize_fp8

__all__ = ["PerformanceWarning", "attention", "decode_plan", "mla_decode", "mla_plan",
           "paged_decode", "prepare_v", "quantize_fp8"]
__version__ = "0.1.0"
