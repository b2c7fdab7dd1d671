"""tileattn: fused attention kernels in Triton for LLM training and serving."""

from .api import (PerformanceWarning, attention, attention_varlen, decode_plan, mla_decode,
                  mla_plan, use_kernels)
from .flex import flex_attention
from .fp8 import prepare_v, quantize_fp8, quantize_qkv_fp8

__all__ = ["PerformanceWarning", "attention", "attention_varlen", "decode_plan",
           "flex_attention", "mla_decode", "mla_plan", "prepare_v", "quantize_fp8",
           "quantize_qkv_fp8", "use_kernels"]
__version__ = "0.1.0"
