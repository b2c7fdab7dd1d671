"""What the attention kernels' config tables and launchers share: the tile config record, which
chips share another chip's rows, the padded head dim tiles span, and how a descale tensor
becomes kernel arguments."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..quantize import TILE_ROWS

# A block descale ([batch, heads, ceil(seqlen / DESCALE_BLOCK_ROWS)], quantize_qkv_fp8's
# per="block") holds one value per this many rows: quantize.py's tile. Attention tiles
# (BLOCK_M, BLOCK_N) divide it, so one tile reads one value.
DESCALE_BLOCK_ROWS = TILE_ROWS


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


# Chips whose rows are another chip's: same shared memory and MMA generation.
SAME_CONFIGS_AS = {"sm86": "sm89", "sm120": "sm89", "sm87": "sm80", "sm100": "sm90",
                    "rocm": "sm80"}


def padded_head_dim(head_dim: int) -> int:
    """Triton tiles are powers of two: 96 runs as 128 and 192 as 256 (padding is masked)."""
    # Plain bit arithmetic: triton.next_power_of_2 is a JIT-wrapped helper whose host cost
    # short-context calls cannot afford (docs/design.md, "Host overhead and the call cache").
    return max(16, 1 << (head_dim - 1).bit_length())


def descale_args(descale: torch.Tensor | None) -> tuple[torch.Tensor | None, int, int]:
    """A descale as (pointer, batch stride, head stride): [batch, heads] with its strides, or a
    scalar (or None) read through strides 0. A block descale's row-block stride:
    block_descale_stride."""
    if descale is None or descale.dim() == 0:
        return descale, 0, 0
    return descale, descale.stride(0), descale.stride(1)


def block_descale_stride(descale: torch.Tensor | None) -> int:
    """The stride between a block descale's 128-row blocks; 0 for any other descale."""
    return descale.stride(2) if descale is not None and descale.dim() == 3 else 0
