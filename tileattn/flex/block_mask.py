"""FlexAttention's BlockMask -> the block lists tileattn's attention kernels iterate.

A BlockMask tiles the [seqlen_q, seqlen_k] score matrix into BLOCK_SIZE = (Q_BLOCK_SIZE,
KV_BLOCK_SIZE) blocks and lists, per (batch, head, query block), the key blocks to visit:
"partial" blocks (kv_num_blocks / kv_indices), where mask_mod decides per element, and
"full" blocks (full_kv_*), visible without mask_mod. The q_* lists are the transpose (per key
block, its query blocks), for backward kernels that walk queries for a block of keys.

The kernels use these tensors as they are (no copy): batch and head dims of size 1
broadcast through stride 0. A kernel tile must lie inside one mask block, so each BLOCK_SIZE
must be a multiple of 16: a power-of-two tile of at least 16 then divides it
(`largest_tile`). torch.compile's flex kernels have the same rule (they refuse tiles that do
not divide the mask's blocks).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

BLOCK_SIZE_MULTIPLE = 16
# torch's block size for "no block mask" (one block covering everything).
_NO_BLOCKS = 1 << 30


@dataclass(frozen=True)
class BlockMaskTensors:
    """Block lists for one flex_attention call (B batch, Hq query heads). All int32, views
    with arbitrary strides (stride 0 where the BlockMask broadcasts batch or heads).

    q_block_size, kv_block_size   queries / keys per mask block (multiples of 16)
    kv_num_blocks       [B, Hq, num_q_blocks]              partial key blocks per query block
    kv_indices          [B, Hq, num_q_blocks, max_kv]      their indices, ascending; entries at
                                                           and past kv_num_blocks are undefined
    full_kv_num_blocks  [B, Hq, num_q_blocks]              full key blocks (all zeros when the
    full_kv_indices     [B, Hq, num_q_blocks, max_full_kv]   BlockMask has none)
    q_num_blocks        [B, Hq, num_kv_blocks]             transposed lists (only when asked
    q_indices           [B, Hq, num_kv_blocks, max_q]       for, else None): per key block, its
    full_q_num_blocks   [B, Hq, num_kv_blocks]             partial / full query blocks
    full_q_indices      [B, Hq, num_kv_blocks, max_full_q]

    num_q_blocks = ceil(seqlen_q / q_block_size) (the tensors may hold more rows, never
    visited); num_kv_blocks = ceil(seqlen_k / kv_block_size). Every listed index is in
    [0, num_kv_blocks) (or [0, num_q_blocks)); blocks crossing a sequence end still need the
    kernel's bounds mask.
    """
    q_block_size: int
    kv_block_size: int
    kv_num_blocks: torch.Tensor
    kv_indices: torch.Tensor
    full_kv_num_blocks: torch.Tensor
    full_kv_indices: torch.Tensor
    q_num_blocks: torch.Tensor | None = None
    q_indices: torch.Tensor | None = None
    full_q_num_blocks: torch.Tensor | None = None
    full_q_indices: torch.Tensor | None = None
    # The BlockMask these lists view: what plans built from them are cached by.
    source: object = None


def largest_tile(block_size: int, preferred: int) -> int:
    """The largest power of two <= preferred that divides block_size (>= 16 when block_size
    is a multiple of 16): the tile a kernel can use inside mask blocks of block_size."""
    tile = 1 << (max(preferred, 1).bit_length() - 1)
    while block_size % tile:
        tile //= 2
    return tile


def is_dense(block_mask) -> bool:
    """torch's stand-in for "no block mask": one huge block."""
    return tuple(block_mask.BLOCK_SIZE) == (_NO_BLOCKS, _NO_BLOCKS)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def block_mask_tensors(block_mask, *, batch: int, num_q_heads: int, seqlen_q: int,
                       seqlen_k: int, device: torch.device,
                       transposed: bool = False) -> BlockMaskTensors | None:
    """Check `block_mask` against the call and return its block lists (None for torch's
    "no block mask" stand-in: every key block is then visited, mask_mod applied everywhere).
    transposed=True also returns the q_* lists (computed if the BlockMask lacks them).

    Raises TypeError / ValueError naming block_mask. The first call with a BlockMask reads
    its block counts and indices on the host once to check them (a synchronisation); later
    calls with the same, unmodified BlockMask do not.
    """
    from torch.nn.attention.flex_attention import BlockMask
    if not isinstance(block_mask, BlockMask):
        raise TypeError(f"block_mask must be a torch.nn.attention.flex_attention.BlockMask or "
                        f"None, got {type(block_mask).__name__}")
    if is_dense(block_mask):
        return None
    _check_shape(block_mask, batch, num_q_heads, seqlen_q, seqlen_k, device)
    q_block_size, kv_block_size = (int(s) for s in block_mask.BLOCK_SIZE)
    num_q_blocks, num_kv_blocks = _cdiv(seqlen_q, q_block_size), _cdiv(seqlen_k, kv_block_size)

    def prepared(tensor):
        tensor = tensor if tensor.dtype == torch.int32 else tensor.to(torch.int32)
        return tensor.expand(batch, num_q_heads, *tensor.shape[2:])

    full_num, full_idx = block_mask.full_kv_num_blocks, block_mask.full_kv_indices
    q_num, q_idx = block_mask.q_num_blocks, block_mask.q_indices
    full_q_num, full_q_idx = block_mask.full_q_num_blocks, block_mask.full_q_indices
    # Every list the BlockMask holds is checked, whether this call uses it or not (so that
    # forward and backward calls share one check); lists made below are right by construction.
    owned = [(block_mask.kv_num_blocks, block_mask.kv_indices, num_kv_blocks, "kv"),
             (full_num, full_idx, num_kv_blocks, "full_kv"),
             (q_num, q_idx, num_q_blocks, "q"), (full_q_num, full_q_idx, num_q_blocks, "full_q")]
    _check_contents(block_mask, [entry for entry in owned if entry[0] is not None])
    if full_num is None:
        empty = torch.zeros((1, 1, 1), dtype=torch.int32, device=device)
        full_num = empty.expand(1, 1, num_q_blocks)
        full_idx = empty[..., None].expand(1, 1, num_q_blocks, 1)
    transposes = [None] * 4
    if transposed:
        if q_num is None:
            q_num, q_idx = _transpose(block_mask.kv_num_blocks, block_mask.kv_indices,
                                      num_kv_blocks)
        if full_q_num is None:
            full_q_num, full_q_idx = _transpose(full_num, full_idx, num_kv_blocks)
        transposes = [q_num, q_idx, full_q_num, full_q_idx]
    views = [prepared(t) for t in (block_mask.kv_num_blocks, block_mask.kv_indices, full_num,
                                   full_idx)]
    views += [None if t is None else prepared(t) for t in transposes]
    return BlockMaskTensors(q_block_size, kv_block_size, *views, source=block_mask)


def _check_shape(block_mask, batch, num_q_heads, seqlen_q, seqlen_k, device) -> None:
    block_size = tuple(block_mask.BLOCK_SIZE)
    if len(block_size) != 2 or not all(isinstance(s, int) and s > 0
                                       and s % BLOCK_SIZE_MULTIPLE == 0 for s in block_size):
        raise ValueError(f"block_mask.BLOCK_SIZE must be two positive multiples of "
                         f"{BLOCK_SIZE_MULTIPLE} (the kernels' tiles must divide the mask's "
                         f"blocks), got {block_size}")
    mask_q, mask_k = block_mask.seq_lengths
    if seqlen_q > mask_q or seqlen_k > mask_k:
        raise ValueError(f"block_mask was created for sequence lengths ({mask_q}, {mask_k}) but "
                         f"the inputs have q_len={seqlen_q} and kv_len={seqlen_k}: create a "
                         "block mask for these lengths")
    if (seqlen_q, seqlen_k) != (mask_q, mask_k):
        raise ValueError(f"block_mask was created for sequence lengths ({mask_q}, {mask_k}) but "
                         f"the inputs have q_len={seqlen_q} and kv_len={seqlen_k}: create a "
                         f"block mask for these lengths, or crop it with "
                         f"block_mask._adjust({seqlen_q}, {seqlen_k}) if its mask_mod allows")
    num_blocks = block_mask.kv_num_blocks
    if block_mask.kv_indices.dim() != 4 or num_blocks.dim() != 3:
        raise ValueError(f"block_mask must have [batch, heads, ...] block lists (kv_indices of 4 "
                         f"dims), got kv_indices of shape {tuple(block_mask.kv_indices.shape)}")
    mask_batch, mask_heads, rows = num_blocks.shape
    if mask_batch not in (1, batch) or mask_heads not in (1, num_q_heads):
        raise ValueError(f"block_mask has batch {mask_batch} and heads {mask_heads}; each must be "
                         f"1 (broadcast) or the query's ({batch}, {num_q_heads})")
    if block_mask.kv_indices.shape[:3] != num_blocks.shape:
        raise ValueError(f"block_mask.kv_indices {tuple(block_mask.kv_indices.shape)} does not "
                         f"match kv_num_blocks {tuple(num_blocks.shape)}")
    if rows < _cdiv(seqlen_q, block_size[0]):
        raise ValueError(f"block_mask has {rows} query blocks, fewer than the "
                         f"{_cdiv(seqlen_q, block_size[0])} that q_len={seqlen_q} needs")
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                 "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"):
        tensor = getattr(block_mask, name)
        if tensor is None:
            continue
        if tensor.device != device:
            raise ValueError(f"block_mask.{name} is on {tensor.device} but the inputs are on "
                             f"{device}: use block_mask.to({str(device)!r})")
        if tensor.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"block_mask.{name} must be int32, got {tensor.dtype}")
        if tensor.shape[:2] != num_blocks.shape[:2]:
            raise ValueError(f"block_mask.{name} has batch/head dims {tuple(tensor.shape[:2])}, "
                             f"kv_num_blocks {tuple(num_blocks.shape[:2])}")


# BlockMask -> what its lists were last checked against (tensor identities, versions, bounds).
_CHECKED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _check_contents(block_mask, lists) -> None:
    """Every count in [0, list width], every listed index in [0, number of blocks): a kernel
    reading a bad index would load keys outside the sequence. One host read per BlockMask."""
    signature = tuple((id(n), n._version, id(i), i._version, bound) for n, i, bound, _ in lists)
    if _CHECKED.get(block_mask) == signature:
        return
    failures = []
    for num_blocks, indices, bound, _ in lists:
        width = indices.shape[-1]
        listed = torch.arange(width, device=indices.device) < num_blocks[..., None]
        failures.append(((num_blocks < 0) | (num_blocks > width)).any())
        failures.append((listed & ((indices < 0) | (indices >= bound))).any())
    failed = torch.stack(failures).tolist()
    for (num_blocks, indices, bound, name), (bad_count, bad_index) in zip(
            lists, zip(failed[0::2], failed[1::2])):
        if bad_count:
            raise ValueError(f"block_mask's {name}_num_blocks has counts outside "
                             f"[0, {indices.shape[-1]}]")
        if bad_index:
            raise ValueError(f"block_mask's {name}_indices lists blocks outside [0, {bound}) "
                             "for these sequence lengths")
    _CHECKED[block_mask] = signature


def _transpose(num_blocks, indices, num_columns):
    """Per column (key block), the rows (query blocks) that list it: the q_* lists of
    BlockMask.from_kv_blocks(compute_q_blocks=True), for masks made without them."""
    width = indices.shape[-1]
    listed = torch.arange(width, device=indices.device) < num_blocks[..., None]
    columns = torch.where(listed, indices.long(), num_columns)   # unlisted -> a spare column
    dense = torch.zeros(*indices.shape[:-1], num_columns + 1, dtype=torch.int32,
                        device=indices.device)
    dense.scatter_(-1, columns, 1)
    by_column = dense[..., :num_columns].transpose(-2, -1)          # [..., columns, rows]
    counts = by_column.sum(-1, dtype=torch.int32)
    order = torch.argsort(by_column, dim=-1, descending=True, stable=True).to(torch.int32)
    return counts, order
