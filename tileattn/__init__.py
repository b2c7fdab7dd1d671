"""tileattn: fused attention kernels in Triton for LLM training and serving."""

from .api import attention
from .fp8 import prepare_v, quantize_fp8

__all__ = ["attention", "prepare_v", "quantize_fp8"]
__version__ = "0.1.0"
