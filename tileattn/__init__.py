"""tileattn: fused attention kernels in Triton for LLM training and serving."""

from .api import PerformanceWarning, attention, mla_decode, mla_plan
from .fp8 import prepare_v, quantize_fp8, quantize_qkv_fp8

__all__ = ["PerformanceWarning", "attention", "mla_decode", "mla_plan", "prepare_v", "quantize_fp8",
           "quantize_qkv_fp8"]
__version__ = "0.1.0"
