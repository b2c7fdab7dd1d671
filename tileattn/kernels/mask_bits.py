"""A mask hook's verdicts on a BlockMask's partial blocks, packed as bits for the Hopper
forward kernel (tileattn/flex/mask_bits.py says when and why).

One program per (entry, BITS_ROWS rows of its query block): it calls MASK_MOD on the entry's
rows x keys, 128 keys (one chunk) at a time, clears keys at and past seqlen_k, and packs each
row's 128 verdicts into 4 words in the order wgmma's accumulator spreads a row over the 4
threads of a quad (docs/design.md, "FlexAttention"):

    bits        int32 [num_entries, q_block, kv_block // 128, 4]: bit 2i + j of word
                (entry, row, chunk, w) is the verdict on query entry_q0 + row and key
                entry_k0 + 128·chunk + 8i + 2w + j (i < 16, j < 2), 0 past seqlen_k
    entries     int32 [num_entries, 4]: the entry's batch, head, first query, first key
                (the hook's batch and head arguments)

Runs under the interpreter too (the hooks are plain Triton).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .runtime import KernelLaunch

# Keys per chunk: the Hopper kernel's key block (BLOCK_N) when it reads bits.
CHUNK_KEYS = 128
# Query rows per program.
BITS_ROWS = 64


@triton.jit
def mask_bits_kernel(bits_ptr, entries_ptr, seqlen_q, seqlen_k, mod_args,
                     MASK_MOD: tl.constexpr, Q_BLOCK: tl.constexpr, KV_CHUNKS: tl.constexpr,
                     BITS_ROWS: tl.constexpr, CHUNK_KEYS: tl.constexpr):
    """Words of one entry's BITS_ROWS rows (module docstring)."""
    entry = tl.program_id(0)
    row_block = tl.program_id(1)
    batch = tl.load(entries_ptr + entry * 4)
    head = tl.load(entries_ptr + entry * 4 + 1)
    q0 = tl.load(entries_ptr + entry * 4 + 2)
    k0 = tl.load(entries_ptr + entry * 4 + 3)
    rows = row_block * BITS_ROWS + tl.arange(0, BITS_ROWS)
    key_in_chunk = tl.arange(0, CHUNK_KEYS)
    # Key 8i + 2w + j of a chunk (i < 16, w < 4, j < 2) is bit 2i + j of word w.
    bit = (2 * (key_in_chunk // 8) + key_in_chunk % 2).to(tl.uint32)
    words_ptr = (bits_ptr + entry.to(tl.int64) * (Q_BLOCK * KV_CHUNKS * 4)
                 + rows[:, None] * (KV_CHUNKS * 4) + tl.arange(0, 4)[None, :])
    for chunk in tl.static_range(KV_CHUNKS):
        keys = k0 + chunk * CHUNK_KEYS + key_in_chunk
        keep = MASK_MOD(batch, head, (q0 + rows)[:, None], keys[None, :],
                        seqlen_k - seqlen_q, mod_args)
        keep = keep & (keys < seqlen_k)[None, :]
        shifted = tl.where(keep, tl.full([1, CHUNK_KEYS], 1, tl.uint32) << bit[None, :], 0)
        # As [rows, i, w, j]: the sum of distinct bits over i and j is their OR.
        words = tl.sum(tl.sum(tl.reshape(shifted, [BITS_ROWS, CHUNK_KEYS // 8, 4, 2]), axis=3),
                       axis=1)
        tl.store(words_ptr + chunk * 4, words.to(tl.int32, bitcast=True))


def mask_bits_launch(bits, entries, seqlen_q: int, seqlen_k: int, mask_mod, mod_args: tuple,
                     ) -> KernelLaunch:
    """The launch that fills bits (module docstring's layout) for `entries`."""
    num_entries, q_block, kv_chunks, _ = bits.shape
    assert q_block % BITS_ROWS == 0
    return KernelLaunch(
        mask_bits_kernel, (num_entries, q_block // BITS_ROWS),
        dict(bits_ptr=bits, entries_ptr=entries, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
             mod_args=tuple(mod_args)),
        dict(MASK_MOD=mask_mod, Q_BLOCK=q_block, KV_CHUNKS=kv_chunks, BITS_ROWS=BITS_ROWS,
             CHUNK_KEYS=CHUNK_KEYS),
        4, 1)
