"""A mask_mod's verdicts on a BlockMask's partial blocks as bits, for the Hopper forward kernel.

A mask_mod that reads captured tensors (document ids, a lookup table) costs, on every score of
every partial block, its loads, its compares and a select; the Hopper kernel
(kernels/attention/sm90_consumers.py) instead reads one word a row a thread and tests a bit a
score, the sequence end included. mask_mods of indices alone (causal, windows, prefix-LM) stay
hooks: their compares cost about what a bit test does (docs/design.md, "FlexAttention").

The bits are rebuilt every call (kernels/mask_bits.py, one program per partial block and 64
rows; its launch bound and replayed), so captured tensors changed in place are seen as the
hook would see them. What depends only on the block lists (the entries and each tile's first
entry) and the bound launch are kept with the TilePlan.

Entries: one per partial block of a group (batch, head, query block), in list order. Batch
and head collapse to 0 where neither the lists (a BlockMask broadcast over them) nor the
mask_mod (which does not read them) tell them apart: a document mask of one BlockMask row per
sequence has entries per sequence, not per head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.mask_bits import BITS_ROWS, CHUNK_KEYS, mask_bits_launch
from ..ops.call_cache import tensor_key
from .block_mask import BlockMaskTensors
from .tile_plan import TilePlan

# The most bytes of bits a call may make (4 bytes a row a 128-key chunk a partial block, per
# distinct batch and head); past it the kernel calls the hook.
MAX_BYTES = 256 << 20


@dataclass(frozen=True)
class MaskBits:
    """bits int32 [entries, q_block, kv_block // 128, 4] (kernels/mask_bits.py's layout);
    first_entry int32 [num_tiles]: the entry of each tile's first partial block (tile ids as
    TilePlan.tile_lists')."""
    bits: torch.Tensor
    first_entry: torch.Tensor
    chunk_keys: int = CHUNK_KEYS


def applies(mask_uses: frozenset | None, lists: BlockMaskTensors | None, block_n: int) -> bool:
    """Whether the call's mask_mod goes to the kernel as bits: block lists, a mask_mod that
    reads captured tensors (mask_uses: the index arguments it reads, ops/flex.py's; None when
    it reads no tensor), the kernel's key block one chunk, the mask's blocks whole chunks and
    whole programs' rows."""
    return (lists is not None and mask_uses is not None and block_n == CHUNK_KEYS
            and lists.kv_block_size % CHUNK_KEYS == 0 and lists.q_block_size % BITS_ROWS == 0)


def _entries(plan: TilePlan, lists: BlockMaskTensors, *, batch: int, num_q_heads: int,
             seqlen_q: int, block_m: int, by_batch: bool, by_head: bool):
    """(entries int32 [E, 4]: batch, head, first query, first key; first_entry int32
    [num_tiles]), kept in plan.derived."""
    key = ("mask_bits", by_batch, by_head, block_m)
    if key in plan.derived:
        return plan.derived[key]
    device = lists.kv_num_blocks.device
    num_q_blocks = -(-seqlen_q // lists.q_block_size)
    groups_b, groups_h = (batch if by_batch else 1), (num_q_heads if by_head else 1)
    counts = lists.kv_num_blocks[:groups_b, :groups_h, :num_q_blocks].reshape(-1).long()
    first = torch.cumsum(counts, 0) - counts
    total = int(counts.sum())                # once per plan: a synchronisation
    group = torch.repeat_interleave(torch.arange(counts.numel(), device=device), counts,
                                    output_size=total)
    step = torch.arange(total, device=device) - first[group]
    q_block = group % num_q_blocks
    b, h = group // num_q_blocks // groups_h, group // num_q_blocks % groups_h
    key_block = lists.kv_indices[b, h, q_block, step].long()
    entries = torch.stack([b, h, q_block * lists.q_block_size, key_block * lists.kv_block_size],
                          dim=1).to(torch.int32).contiguous()
    # Tile id m + num_m_blocks (batch · num_q_heads + head), as tile_lists'.
    num_m_blocks = -(-seqlen_q // block_m)
    tile = torch.arange(batch * num_q_heads * num_m_blocks, device=device)
    batch_head = tile // num_m_blocks
    tile_group = ((((batch_head // num_q_heads) if by_batch else 0) * groups_h
                   + ((batch_head % num_q_heads) if by_head else 0)) * num_q_blocks
                  + tile % num_m_blocks * block_m // lists.q_block_size)
    result = (entries, first[tile_group].to(torch.int32).contiguous())
    plan.derived[key] = result
    return result


def build(mask_mod, mod_args: tuple, mask_uses: frozenset, plan: TilePlan,
          lists: BlockMaskTensors, *, batch: int, num_q_heads: int, seqlen_q: int,
          seqlen_k: int, block_m: int) -> MaskBits | None:
    """The call's MaskBits for the hook mask_mod (applies() must hold), or None where they
    would pass MAX_BYTES or the lists have no partial block (no verdict to read)."""
    by_batch = lists.kv_num_blocks.stride(0) != 0 or "batch" in mask_uses
    by_head = lists.kv_num_blocks.stride(1) != 0 or "head" in mask_uses
    entries, first_entry = _entries(plan, lists, batch=batch, num_q_heads=num_q_heads,
                                    seqlen_q=seqlen_q, block_m=block_m, by_batch=by_batch,
                                    by_head=by_head)
    chunks = lists.kv_block_size // CHUNK_KEYS
    shape = (entries.shape[0], lists.q_block_size, chunks, 4)
    if not 0 < entries.shape[0] * lists.q_block_size * chunks * 16 <= MAX_BYTES:
        return None
    bits = torch.empty(shape, dtype=torch.int32, device=entries.device)
    # The launch is bound once per plan, hook and captured tensors' signature and replayed:
    # Triton's launch path costs a short call more host time than the bits save it
    # (docs/design.md, "FlexAttention").
    captured = tuple(tensor_key(x) for x in mod_args)
    signature = ("launch", by_batch, by_head, block_m, mask_mod, captured)
    bound = plan.derived.get(signature) if None not in captured else None
    if bound is not None:
        bound.run(bits_ptr=bits, entries_ptr=entries, mod_args=tuple(mod_args))
    else:
        launch = mask_bits_launch(bits, entries, seqlen_q, seqlen_k, mask_mod, mod_args)
        launch.run()
        bound = launch.bind() if None not in captured else None
        if bound is not None:
            plan.derived[signature] = bound
    return MaskBits(bits, first_entry)
