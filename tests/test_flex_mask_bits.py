"""flex/mask_bits.py and kernels/mask_bits.py: a mask_mod's verdicts on a BlockMask's partial
blocks as bits, built in the interpreter and read back the way the Hopper kernel reads them
(Consumer.mask_verdict: entry, row, chunk, the quad thread's word, the column's bit), against
the mask_mod evaluated by torch. The kernel itself runs on the GPU only
(tests/gpu/test_flex_sm90.py)."""

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from tileattn.flex import mask_bits
from tileattn.flex.block_mask import block_mask_tensors
from tileattn.flex.tile_plan import tile_plan
from tileattn.flex.translate import translate_mods

from .flex_functions import doc_ids_for, document

BLOCK_M = 128
CPU = torch.device("cpu")


def _setup(mask_mod, *, batch=2, heads=3, seqlen_q=333, seqlen_k=700, block_size=(128, 128),
           mask_heads=1):
    block_mask = create_block_mask(mask_mod, batch, mask_heads, seqlen_q, seqlen_k, device="cpu",
                                   BLOCK_SIZE=block_size)
    lists = block_mask_tensors(block_mask, batch=batch, num_q_heads=heads, seqlen_q=seqlen_q,
                               seqlen_k=seqlen_k, device=CPU)
    plan = tile_plan(lists, batch=batch, num_q_heads=heads, seqlen_q=seqlen_q,
                     seqlen_k=seqlen_k, block_m=BLOCK_M, num_programs=4, kv_bytes_per_key=512)
    hooks = translate_mods(None, mask_mod, device=CPU)
    return lists, plan, hooks


def _build(mask_mod, lists, plan, hooks, *, batch=2, heads=3, seqlen_q=333, seqlen_k=700):
    uses = hooks.mask_uses if hooks.mask_reads_tensors else None
    assert mask_bits.applies(uses, lists, 128)
    return mask_bits.build(hooks.mask_mod, hooks.mod_args, uses, plan, lists, batch=batch,
                           num_q_heads=heads, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
                           block_m=BLOCK_M)


def _check_every_partial_step(mask_mod, lists, plan, made, *, batch=2, heads=3, seqlen_q=333,
                              seqlen_k=700):
    """Every tile's partial steps, decoded as the kernel reads them, equal mask_mod (and the
    sequence end) on the tile's real rows."""
    num_m_blocks = -(-seqlen_q // BLOCK_M)
    chunks = made.bits.shape[2]
    cols = torch.arange(128)
    bit = 1 << (2 * (cols // 8) + cols % 2)
    checked = 0
    for tile in range(batch * heads * num_m_blocks):
        m, batch_head = tile % num_m_blocks, tile // num_m_blocks
        b, h = batch_head // heads, batch_head % heads
        q_block = m * BLOCK_M // lists.q_block_size
        first_row = q_block * lists.q_block_size
        rows = m * BLOCK_M + torch.arange(BLOCK_M)
        real = rows < seqlen_q
        for j in range(int(plan.tile_lists[tile, 0]) * chunks):
            entry = int(made.first_entry[tile]) + j // chunks
            words = made.bits[entry, rows - first_row, j % chunks][:, (cols % 8) // 2]
            got = (words.long() & bit) != 0
            key_block = int(lists.kv_indices[b, h, q_block, j // chunks])
            keys = key_block * lists.kv_block_size + j % chunks * 128 + cols
            want = mask_mod(torch.tensor(b), torch.tensor(h), rows[real, None],
                            keys.clamp(max=seqlen_k - 1)[None]) & (keys < seqlen_k)
            assert torch.equal(got[real], want), (tile, j)
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("block_size", [(128, 128), (256, 128), (128, 256)])
def test_document_mask_bits_read_back_as_the_mask(block_size):
    """Ids captured, read by batch (entries per sequence, shared by the heads), odd lengths,
    Sq != Sk, query blocks of 128 or 256 rows (the kernel's 128-row tiles within them), key
    blocks of one or two chunks."""
    mask_mod = document(doc_ids_for(2, 700, 4))
    lists, plan, hooks = _setup(mask_mod, block_size=block_size)
    assert hooks.mask_reads_tensors and hooks.mask_uses == {"batch", "q_idx", "kv_idx"}
    made = _build(mask_mod, lists, plan, hooks)
    # One entry per partial block of each sequence's query blocks, none per head.
    num_q_blocks = -(-333 // block_size[0])
    assert made.bits.shape[0] == int(lists.kv_num_blocks[:, 0, :num_q_blocks].sum())
    _check_every_partial_step(mask_mod, lists, plan, made)


def test_a_mask_reading_the_head_gets_entries_per_head():
    """A mask_mod of a captured per-head table over a BlockMask broadcast over heads: the
    bits follow the head the kernel passes, as the hook would."""
    widths = torch.tensor([50, 200, 400])

    def banded(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() < widths[h]
    mask_mod = banded
    # The BlockMask from head 2, the widest band, so that its lists cover the other heads'.
    lists, plan, hooks = _setup(lambda b, h, q, kv: (q - kv).abs() < 400)
    hooks = translate_mods(None, mask_mod, device=CPU)
    assert hooks.mask_uses == {"head", "q_idx", "kv_idx"}
    made = _build(mask_mod, lists, plan, hooks)
    assert made.bits.shape[0] == 3 * int(lists.kv_num_blocks[:, 0, :3].sum())
    _check_every_partial_step(mask_mod, lists, plan, made)


def test_bits_apply_to_masks_that_read_tensors_on_whole_chunks_only():
    mask_mod = document(doc_ids_for(2, 700, 4))
    lists, plan, hooks = _setup(mask_mod)
    uses = hooks.mask_uses
    assert mask_bits.applies(uses, lists, 128)
    assert not mask_bits.applies(uses, lists, 64)         # the kernel's key blocks: one chunk
    assert not mask_bits.applies(None, lists, 128)        # reads no tensor: stays a hook
    assert not mask_bits.applies(uses, None, 128)
    causal_hooks = translate_mods(None, lambda b, h, q, kv: q >= kv, device=CPU)
    assert not causal_hooks.mask_reads_tensors
    other = _setup(mask_mod, block_size=(128, 192))[0]
    assert not mask_bits.applies(uses, other, 128)


def test_past_the_byte_budget_the_hook_stays(monkeypatch):
    mask_mod = document(doc_ids_for(2, 700, 4))
    lists, plan, hooks = _setup(mask_mod)
    monkeypatch.setattr(mask_bits, "MAX_BYTES", 1024)
    assert mask_bits.build(hooks.mask_mod, hooks.mod_args, hooks.mask_uses, plan, lists,
                           batch=2, num_q_heads=3, seqlen_q=333, seqlen_k=700,
                           block_m=BLOCK_M) is None


def test_lists_without_partial_blocks_need_no_bits():
    """Documents on block boundaries, no causal mask: every listed block is full, so the kernel
    never reads a verdict and no bits are made."""
    doc_ids = (torch.arange(768) // 256).repeat(2, 1)
    mask_mod = document(doc_ids)
    lists, plan, hooks = _setup(mask_mod, seqlen_q=768, seqlen_k=768)
    assert int(lists.kv_num_blocks.sum()) == 0
    assert mask_bits.build(hooks.mask_mod, hooks.mod_args, hooks.mask_uses, plan, lists,
                           batch=2, num_q_heads=3, seqlen_q=768, seqlen_k=768,
                           block_m=BLOCK_M) is None
