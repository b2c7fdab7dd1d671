"""FlexAttention on tileattn's kernels: torch's score_mod / mask_mod functions translated into
kernel hooks (translate.py), its BlockMask into block lists (block_mask.py), and the public
flex_attention (api.py)."""

from .api import flex_attention

__all__ = ["flex_attention"]
