"""flex/tile_plan.py: a BlockMask's lists per 128-query tile of the Hopper kernel, read back
on the CPU the way sm90_tiles.Problem reads them (the kernel itself runs on the GPU only:
tests/gpu/test_flex_sm90.py)."""

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from tileattn.flex.block_mask import block_mask_tensors
from tileattn.flex.tile_plan import tile_plan

from .flex_functions import doc_ids_for, document


def _memory(view):
    """The int32 memory from view's first element on, as the kernel's pointer sees it."""
    size = view.untyped_storage().nbytes() // view.element_size() - view.storage_offset()
    return view.as_strided((size,), (1,))


def _steps(plan, tile, block_n):
    """(key start, masked, partial) of every step of `tile`, as the kernel walks them."""
    partial, full, clean, partial_at, full_at = plan.tile_lists[tile].tolist()
    steps_per_block = plan.kv_block_size // block_n
    partial_rows, full_rows = (_memory(plan.kv_indices), _memory(plan.full_kv_indices))
    walked = []
    for j in range((partial + full) * steps_per_block):
        listed = j < partial * steps_per_block
        row, at = (partial_rows, partial_at) if listed else (full_rows, full_at)
        index = j if listed else j - partial * steps_per_block
        block = int(row[at + index // steps_per_block])
        start = block * plan.kv_block_size + index % steps_per_block * block_n
        masked = listed or j >= (partial + clean) * steps_per_block
        walked.append((start, masked, listed))
    return walked


@pytest.mark.parametrize("block_size,block_n", [((128, 128), 128), ((256, 128), 64)])
def test_tiles_walk_exactly_the_listed_blocks(block_size, block_n):
    batch, heads, seqlen_q, seqlen_k = 2, 3, 700, 650
    mask_mod = document(doc_ids_for(batch, 700, 4))
    mask = create_block_mask(mask_mod, batch, 1, seqlen_q, seqlen_k, device="cpu",
                             BLOCK_SIZE=block_size)
    lists = block_mask_tensors(mask, batch=batch, num_q_heads=heads, seqlen_q=seqlen_q,
                               seqlen_k=seqlen_k, device=torch.device("cpu"))
    plan = tile_plan(lists, batch=batch, num_q_heads=heads, seqlen_q=seqlen_q,
                     seqlen_k=seqlen_k, block_m=128, num_programs=7, kv_bytes_per_key=512)
    num_m_blocks = 6
    assert plan.tile_lists.shape == (batch * heads * num_m_blocks, 5)
    assert sorted(plan.tile_ids.tolist()) == list(range(batch * heads * num_m_blocks))
    dense = mask.to_dense()                                  # [B, 1, q blocks, kv blocks]
    for tile in range(batch * heads * num_m_blocks):
        m_block, b = tile % num_m_blocks, tile // num_m_blocks // heads
        q_block = m_block * 128 // block_size[0]
        walked = _steps(plan, tile, block_n)
        want = {kv * block_size[1] + s * block_n
                for kv in torch.nonzero(dense[b, 0, q_block]).flatten().tolist()
                for s in range(block_size[1] // block_n)}
        assert sorted(start for start, _, _ in walked) == sorted(want)
        for start, masked, listed in walked:
            # Unmasked steps lie wholly inside the keys; partial steps are always masked.
            assert masked or start + block_size[1] - start % block_size[1] <= seqlen_k
            assert masked or not listed
    # Unchanged mask, same shapes: the cached plan.
    again = tile_plan(block_mask_tensors(mask, batch=batch, num_q_heads=heads,
                                               seqlen_q=seqlen_q, seqlen_k=seqlen_k,
                                               device=torch.device("cpu")),
                      batch=batch, num_q_heads=heads, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
                      block_m=128, num_programs=7, kv_bytes_per_key=512)
    assert again is plan
