"""What the attention backward kernels need from a flex_attention call: its BlockMask as one
mask hook. The backward kernels (kernels/attention/bwd*.py) walk every block and take a
MASK_MOD; a BlockMask is literal (blocks it does not list are hidden, full blocks skip
mask_mod), so the hook looks each pair's block up in a table of block kinds and applies the
user's mask_mod only in partial blocks. The backward then costs the dense Sq·Sk, whatever the
mask's sparsity (docs/design.md, "FlexAttention").
"""

from __future__ import annotations

import torch

from . import translate
from .block_mask import BlockMaskTensors

HIDDEN, PARTIAL, FULL = 0, 1, 2

# The composed hook; {slot} is the first of its mod_args entries (after the user's).
_WRAPPER = '''

@triton.jit
def mask_mod(batch, head, q_idx, kv_idx, q_shift, mod_args):
    # The BlockMask's kind of (q_idx, kv_idx)'s block: 0 hidden, 1 partial, 2 full.
    q_block = q_idx // mod_args[{slot} + 4]
    kv_block = kv_idx // mod_args[{slot} + 5]
    inside = (q_block < mod_args[{slot} + 6]) & (kv_block < mod_args[{slot} + 7])
    kind = tl.load(mod_args[{slot}] + batch * mod_args[{slot} + 1] + head * mod_args[{slot} + 2]
                   + q_block * mod_args[{slot} + 3] + kv_block, mask=inside, other=0)
    return (kind == 2) | ({partial})
'''


def block_kinds(lists: BlockMaskTensors, *, batch: int, num_q_heads: int, seqlen_q: int,
                seqlen_k: int) -> torch.Tensor:
    """int8 [batch, num_q_heads, query blocks, key blocks]: HIDDEN, PARTIAL or FULL."""
    num_q_blocks = -(-seqlen_q // lists.q_block_size)
    num_kv_blocks = -(-seqlen_k // lists.kv_block_size)
    kinds = torch.zeros(batch, num_q_heads, num_q_blocks, num_kv_blocks + 1, dtype=torch.int8,
                        device=lists.kv_num_blocks.device)
    for counts, indices, kind in ((lists.kv_num_blocks, lists.kv_indices, PARTIAL),
                                  (lists.full_kv_num_blocks, lists.full_kv_indices, FULL)):
        counts, indices = counts[:, :, :num_q_blocks], indices[:, :, :num_q_blocks]
        listed = torch.arange(indices.shape[-1], device=indices.device) < counts[..., None]
        columns = torch.where(listed, indices.long(), num_kv_blocks)   # unlisted: a spare column
        kinds.scatter_(-1, columns, kind)
    return kinds[..., :num_kv_blocks].contiguous()


def block_mask_hook(user_mask_hook, num_user_args: int):
    """The composed MASK_MOD (module docstring) whose table entries follow the user's
    num_user_args mod_args; user_mask_hook: the translated mask_mod, or None (every pair of a
    partial block visible)."""
    if user_mask_hook is None:
        source = translate._HEADER.format(label="a BlockMask without mask_mod", slots="#   -")
        partial = "kind == 1"
    else:
        source = translate.translated_source(user_mask_hook).replace(
            "def mask_mod(", "def user_mask_mod(", 1)
        partial = "(kind == 1) & user_mask_mod(batch, head, q_idx, kv_idx, q_shift, mod_args)"
    source += _WRAPPER.format(slot=num_user_args, partial=partial)
    return translate._load_module(source).mask_mod


def block_mask_args(kinds: torch.Tensor, lists: BlockMaskTensors) -> tuple:
    """The composed hook's mod_args entries for a block_kinds table."""
    return (kinds, kinds.stride(0), kinds.stride(1), kinds.stride(2), lists.q_block_size,
            lists.kv_block_size, kinds.shape[2], kinds.shape[3])
