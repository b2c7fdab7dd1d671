"""A BlockMask's block lists as the Hopper kernel walks them (kernels/attention/sm90_tiles.py):
per tile of BLOCK_M queries, its partial and full key blocks, and the programs' work lists
ordered by each tile's listed blocks.

Built on the device but for the work lists (LPT on the host, which reads every tile's block
count once), and kept per BlockMask: later calls with the same, unmodified mask and shapes
reuse the plan, so they neither synchronise nor allocate.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

from ..scheduler import heads_per_group, weighted_work_lists_python
from .block_mask import BlockMaskTensors


@dataclass(frozen=True)
class TilePlan:
    """What attention_sm90_launch takes for a block mask.

    kv_block_size   keys per mask block (a multiple of the kernel's BLOCK_N)
    tile_lists      int32 [num_tiles, 5], per tile id m_block + num_m_blocks·(batch·Hq + head):
                    partial blocks, full blocks, full blocks before one crossing seqlen_k, and
                    the element offsets of the tile's rows in kv_indices / full_kv_indices
    kv_indices, full_kv_indices   the lists (views the offsets are relative to)
    tile_ids, tile_starts         the programs' work lists (scheduler.prefill's format)
    derived         what callers compute from the lists alone, kept as long as the plan
                    (flex/mask_bits.py's entries)
    """
    kv_block_size: int
    tile_lists: torch.Tensor
    kv_indices: torch.Tensor
    full_kv_indices: torch.Tensor
    tile_ids: torch.Tensor
    tile_starts: torch.Tensor
    derived: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_programs(self) -> int:
        return self.tile_starts.shape[0] - 1


def tile_lists(lists: BlockMaskTensors, *, batch: int, num_q_heads: int, seqlen_q: int,
               seqlen_k: int, block_m: int) -> torch.Tensor:
    """TilePlan.tile_lists for tiles of block_m queries (block_m divides the mask's query
    blocks)."""
    assert lists.q_block_size % block_m == 0, (lists.q_block_size, block_m)
    device = lists.kv_num_blocks.device
    num_m_blocks = -(-seqlen_q // block_m)
    b = torch.arange(batch, device=device)[:, None, None]
    h = torch.arange(num_q_heads, device=device)[None, :, None]
    qb = (torch.arange(num_m_blocks, device=device) * block_m // lists.q_block_size)[None, None]
    partial = lists.kv_num_blocks[b, h, qb]
    full = lists.full_kv_num_blocks[b, h, qb]
    # The last full block may cross the sequence end: it then needs the bounds mask.
    last = lists.full_kv_indices[b, h, qb, (full - 1).clamp(min=0)]
    crosses = (full > 0) & ((last + 1) * lists.kv_block_size > seqlen_k)
    offsets = []
    for indices in (lists.kv_indices, lists.full_kv_indices):
        offset = b * indices.stride(0) + h * indices.stride(1) + qb * indices.stride(2)
        offsets.append(offset.expand(batch, num_q_heads, num_m_blocks))
    table = torch.stack([partial.int(), full.int(), (full - crosses.int()).int(),
                         *(o.int() for o in offsets)], dim=-1)
    if max(int(lists.kv_indices.numel()), int(lists.full_kv_indices.numel())) >= 2**31:
        raise ValueError("block_mask's index lists are too large for int32 offsets")
    return table.reshape(-1, 5).contiguous()


# BlockMask -> (signature of what the plan was built for, TilePlan).
_PLANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def tile_plan(lists: BlockMaskTensors, *, batch: int, num_q_heads: int, seqlen_q: int,
              seqlen_k: int, block_m: int, num_programs: int, kv_bytes_per_key: int) -> TilePlan:
    """The plan of a BlockMask's lists for this call's shapes; cached per BlockMask
    (lists.source) while its tensors are unmodified. kv_bytes_per_key: one key's K and V
    bytes (the L2 grouping of the causal-like orders)."""
    block_mask = lists.source
    signature = None
    if block_mask is not None:
        tensors = (block_mask.kv_num_blocks, block_mask.kv_indices,
                   block_mask.full_kv_num_blocks, block_mask.full_kv_indices)
        signature = (tuple(None if t is None else (id(t), t._version) for t in tensors), batch,
                     num_q_heads, seqlen_q, seqlen_k, block_m, num_programs, kv_bytes_per_key)
        cached = _PLANS.get(block_mask)
        if cached is not None and cached[0] == signature:
            return cached[1]
    table = tile_lists(lists, batch=batch, num_q_heads=num_q_heads, seqlen_q=seqlen_q,
                       seqlen_k=seqlen_k, block_m=block_m)
    costs = (table[:, 0] + table[:, 1]).tolist()
    num_m_blocks = -(-seqlen_q // block_m)
    uniform = min(costs) == max(costs)
    group_heads = 1 if uniform else heads_per_group(True, seqlen_k, kv_bytes_per_key, 1)
    # An empty tile still writes its rows (zeros, lse -inf): it costs a little.
    ids, starts = weighted_work_lists_python([4 * c + 1 for c in costs], num_m_blocks,
                                             batch * num_q_heads,
                                             min(num_programs, len(costs)), group_heads)
    device = table.device
    plan = TilePlan(lists.kv_block_size, table, lists.kv_indices, lists.full_kv_indices,
                    torch.tensor(ids, dtype=torch.int32, device=device),
                    torch.tensor(starts, dtype=torch.int32, device=device))
    if block_mask is not None:
        _PLANS[block_mask] = (signature, plan)
    return plan
