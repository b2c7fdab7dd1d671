"""Which keys each tile of the Hopper attention kernel (sm90.py) visits, shared by its loader
and consumer partitions: the problem as a Gluon aggregate (sizes, work list, masks, block
lists, hooks) and one decoded work tile.

A tile walks "steps" j in [first_block, num_blocks), each a block of BLOCK_N keys starting at
Problem.key_start(tile, j). Steps in [first_full, num_full) need no mask; the others do.
  * Dense (KV_BLOCK == 0): step j is keys [j·BLOCK_N, (j + 1)·BLOCK_N); causal and a left
    window bound the range (masks.py's rule); masked steps cross the window's left bound, the
    causal diagonal or the sequence end.
  * Block lists (KV_BLOCK > 0, FlexAttention's BlockMask, tileattn/flex/tile_plan.py): a
    tile's steps are its partial blocks, then its full ones, each block KV_BLOCK keys walked
    BLOCK_N at a time. Partial steps take MASK_MOD; full steps none, except the last listed
    block when it crosses the sequence end (bounds only). With MASK_BITS partial steps read
    the mask hook's verdicts as bits (kernels/mask_bits.py's layout) instead of calling it:
    a tile's partial block i is entry bits_first + i, its rows those of its mask query block.

No `from __future__ import annotations` here: Gluon checks aggregate fields against their
annotations at compile time, so the annotations must be classes, not strings.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.language.core import _aggregate as aggregate

from ..gluon_common import Scalar, scalar

# Per tile of a block-list problem (tile_lists row, int32): partial blocks, full blocks, full
# blocks before one that crosses the sequence end, and the offsets of the tile's partial and
# full index rows in kv_indices / full_kv_indices.
TILE_LIST_FIELDS = gl.constexpr(5)


@aggregate
class Problem:
    """What every partition knows: this program's work list, the problem's sizes, the softmax
    scale (base 2) and the tile shape (BLOCK_M queries, BLOCK_N keys, NUM_STAGES K/V buffers).
    With SOFTCAP, scores become cap·tanh(scale·q·k / cap): softcap_in = scale / cap (tanh's
    argument per raw score) and softmax_scale_log2 = cap·log2(e). With HAS_LEFT,
    query i (at key position p = i + seqlen_k - seqlen_q) sees no key before p - window_left
    (masks.py's rule): tiles visit only the key blocks of their window. With KV_BLOCK > 0 the
    tiles visit block lists (module docstring; tile_lists, kv_index_ptr, full_index_ptr).
    SCORE_MOD / MASK_MOD: docs/design.md's hooks ("Mods"), or None; SCORE_LINEAR: SCORE_MOD is
    score + c (q_idx - kv_idx) + d with c, d fixed by batch and head (flex/linear.py).
    MASK_BITS: MASK_MOD's verdicts come from mask_bits_ptr (kernels/mask_bits.py's words, for
    query blocks of BITS_Q_BLOCK rows), a tile's first entry from bits_first_ptr[tile id]."""
    tile_ids_ptr: Scalar
    tile_starts_ptr: Scalar
    num_m_blocks: Scalar
    num_q_heads: Scalar
    gqa_group_size: Scalar
    seqlen_q: Scalar
    seqlen_k: Scalar
    softmax_scale_log2: Scalar
    softcap_in: Scalar
    window_left: Scalar
    tile_lists_ptr: Scalar
    kv_index_ptr: Scalar
    full_index_ptr: Scalar
    tile_ends_ptr: Scalar
    cu_seqlens_q_ptr: Scalar
    cu_seqlens_k_ptr: Scalar
    mask_bits_ptr: Scalar
    bits_first_ptr: Scalar
    BLOCK_M: gl.constexpr
    BLOCK_N: gl.constexpr
    NUM_STAGES: gl.constexpr
    CAUSAL: gl.constexpr
    SOFTCAP: gl.constexpr
    HAS_LEFT: gl.constexpr
    KV_BLOCK: gl.constexpr
    SCORE_MOD: gl.constexpr
    SCORE_LINEAR: gl.constexpr
    MASK_MOD: gl.constexpr
    VARLEN: gl.constexpr
    MASK_BITS: gl.constexpr
    BITS_Q_BLOCK: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, tile_ids_ptr, tile_starts_ptr, num_m_blocks, num_q_heads, gqa_group_size,
                 seqlen_q, seqlen_k, softmax_scale_log2, softcap_in, window_left, tile_lists_ptr,
                 kv_index_ptr, full_index_ptr, tile_ends_ptr, cu_seqlens_q_ptr, cu_seqlens_k_ptr,
                 mask_bits_ptr, bits_first_ptr, BLOCK_M,
                 BLOCK_N, NUM_STAGES, CAUSAL, SOFTCAP, HAS_LEFT, KV_BLOCK, SCORE_MOD,
                 SCORE_LINEAR, MASK_MOD, VARLEN, MASK_BITS, BITS_Q_BLOCK):
        self.tile_ids_ptr = scalar(tile_ids_ptr)
        self.tile_starts_ptr = scalar(tile_starts_ptr)
        self.num_m_blocks = scalar(num_m_blocks)
        self.num_q_heads = scalar(num_q_heads)
        self.gqa_group_size = scalar(gqa_group_size)
        self.seqlen_q = scalar(seqlen_q)
        self.seqlen_k = scalar(seqlen_k)
        self.softmax_scale_log2 = scalar(softmax_scale_log2)
        self.softcap_in = scalar(softcap_in)
        self.window_left = scalar(window_left)
        self.tile_lists_ptr = scalar(tile_lists_ptr)
        self.kv_index_ptr = scalar(kv_index_ptr)
        self.full_index_ptr = scalar(full_index_ptr)
        self.tile_ends_ptr = scalar(tile_ends_ptr)
        self.cu_seqlens_q_ptr = scalar(cu_seqlens_q_ptr)
        self.cu_seqlens_k_ptr = scalar(cu_seqlens_k_ptr)
        self.mask_bits_ptr = scalar(mask_bits_ptr)
        self.bits_first_ptr = scalar(bits_first_ptr)
        self.BLOCK_M = gl.constexpr(BLOCK_M)
        self.BLOCK_N = gl.constexpr(BLOCK_N)
        self.NUM_STAGES = gl.constexpr(NUM_STAGES)
        self.CAUSAL = gl.constexpr(CAUSAL)
        self.SOFTCAP = gl.constexpr(SOFTCAP)
        self.HAS_LEFT = gl.constexpr(HAS_LEFT)
        self.KV_BLOCK = gl.constexpr(KV_BLOCK)
        self.SCORE_MOD = gl.constexpr(SCORE_MOD)
        self.SCORE_LINEAR = gl.constexpr(SCORE_LINEAR)
        self.MASK_MOD = gl.constexpr(MASK_MOD)
        self.VARLEN = gl.constexpr(VARLEN)
        self.MASK_BITS = gl.constexpr(MASK_BITS)
        self.BITS_Q_BLOCK = gl.constexpr(BITS_Q_BLOCK)

    @gluon.jit
    def tile_range(self):
        """This program's tiles are tile_ids[start:end] (varlen: those holding queries)."""
        start = gl.load(self.tile_starts_ptr + gl.program_id(0))
        if self.VARLEN:
            end = gl.load(self.tile_ends_ptr + gl.program_id(0))
        else:
            end = gl.load(self.tile_starts_ptr + gl.program_id(0) + 1)
        return start, end

    @gluon.jit
    def tile(self, t):
        """Work item t of the list, decoded."""
        tile = gl.load(self.tile_ids_ptr + t)
        m_block = tile % self.num_m_blocks
        batch_head = tile // self.num_m_blocks
        batch = batch_head // self.num_q_heads
        head = batch_head % self.num_q_heads
        kv_head = head // self.gqa_group_size
        if self.KV_BLOCK > 0:
            work = self._listed_tile(tile, m_block, batch, head, kv_head)
        elif self.VARLEN:
            q_start = gl.load(self.cu_seqlens_q_ptr + batch)
            k_start = gl.load(self.cu_seqlens_k_ptr + batch)
            work = self._dense_tile(m_block, batch, head, kv_head, q_start, k_start,
                                    gl.load(self.cu_seqlens_q_ptr + batch + 1) - q_start,
                                    gl.load(self.cu_seqlens_k_ptr + batch + 1) - k_start)
        else:
            work = self._dense_tile(m_block, batch, head, kv_head, 0, 0, self.seqlen_q,
                                    self.seqlen_k)
        return work

    @gluon.jit
    def _listed_tile(self, tile, m_block, batch, head, kv_head):
        """A block-list tile: its row of tile_lists (dense sequences)."""
        STEPS: gl.constexpr = self.KV_BLOCK // self.BLOCK_N
        row = self.tile_lists_ptr + tile.to(gl.int64) * TILE_LIST_FIELDS
        num_partial = gl.load(row)
        num_listed = num_partial + gl.load(row + 1)
        num_clean = num_partial + gl.load(row + 2)
        partial_ptr = self.kv_index_ptr + gl.load(row + 3)
        full_ptr = self.full_index_ptr + gl.load(row + 4)
        bits_first = 0
        if self.MASK_BITS:
            bits_first = gl.load(self.bits_first_ptr + tile)
        return WorkTile(m_block, batch, head, kv_head, 0, num_partial * STEPS, num_listed * STEPS,
                        num_clean * STEPS, partial_ptr, full_ptr, 0, 0, self.seqlen_q,
                        self.seqlen_k, bits_first)

    @gluon.jit
    def _dense_tile(self, m_block, batch, head, kv_head, q_start, k_start, seqlen_q, seqlen_k):
        """A dense tile of a sequence of seqlen_q queries and seqlen_k keys: its key range from
        causal and the window."""
        # Query i sees keys j <= i + causal_shift (bottom-right aligned when seqlen_q != seqlen_k).
        causal_shift = seqlen_k - seqlen_q
        if self.CAUSAL:
            key_end = gl.maximum(
                gl.minimum(seqlen_k, (m_block + 1) * self.BLOCK_M + causal_shift), 0)
            first_row_sees = gl.minimum(m_block * self.BLOCK_M + causal_shift + 1, seqlen_k)
            num_full = gl.maximum(first_row_sees, 0) // self.BLOCK_N
        else:
            key_end = seqlen_k
            num_full = seqlen_k // self.BLOCK_N
        num_blocks = gl.cdiv(key_end, self.BLOCK_N)
        first_block = 0
        first_full = 0
        if self.HAS_LEFT:
            # The first row's window starts the first block; from the last real row's window
            # start on, no row of the tile needs the left bound.
            last_row = gl.minimum((m_block + 1) * self.BLOCK_M, seqlen_q) - 1
            first_block = gl.maximum(m_block * self.BLOCK_M + causal_shift - self.window_left,
                                     0) // self.BLOCK_N
            first_full = gl.cdiv(gl.maximum(last_row + causal_shift - self.window_left, 0),
                                 self.BLOCK_N)
        return WorkTile(m_block, batch, head, kv_head, first_block, first_full, num_blocks,
                        num_full, 0, 0, q_start, k_start, seqlen_q, seqlen_k, 0)

    @gluon.jit
    def runs(self, tile):
        """Whether a tile holds queries: a varlen work list holds every tile of the longest
        sequence, and both partitions skip those past their own sequence's end."""
        if self.VARLEN:
            result = tile.m_block * self.BLOCK_M < tile.seqlen_q
        else:
            result = True
        return result

    @gluon.jit
    def key_start(self, tile, j):
        """The first key of step j of `tile`."""
        if self.KV_BLOCK > 0:
            STEPS: gl.constexpr = self.KV_BLOCK // self.BLOCK_N
            if j < tile.first_full:
                block = gl.load(tile.partial_ptr + j // STEPS)
            else:
                block = gl.load(tile.full_ptr + (j - tile.first_full) // STEPS)
            start = block * self.KV_BLOCK + (j % STEPS) * self.BLOCK_N
        else:
            start = j * self.BLOCK_N
        return start


@aggregate
class WorkTile:
    """One work item: BLOCK_M queries (m_block) of one (batch, head); its steps
    [first_block, num_blocks), of which those in [first_full, num_full) need no mask (dense:
    those below first_full cross the left window bound, those from num_full on the causal
    diagonal or the sequence end; block lists: partial steps, then full ones). partial_ptr /
    full_ptr: the tile's rows of the block lists (block lists only). Its sequence: queries
    [q_start, q_start + seqlen_q) and keys [k_start, k_start + seqlen_k) of the (packed, with
    VARLEN) tensors. bits_first: with MASK_BITS, the bits entry of its first partial block."""
    m_block: Scalar
    batch: Scalar
    head: Scalar
    kv_head: Scalar
    first_block: Scalar
    first_full: Scalar
    num_blocks: Scalar
    num_full: Scalar
    partial_ptr: Scalar
    full_ptr: Scalar
    q_start: Scalar
    k_start: Scalar
    seqlen_q: Scalar
    seqlen_k: Scalar
    bits_first: Scalar

    @gluon.constexpr_function
    def __init__(self, m_block, batch, head, kv_head, first_block, first_full, num_blocks,
                 num_full, partial_ptr, full_ptr, q_start, k_start, seqlen_q, seqlen_k,
                 bits_first):
        self.m_block = scalar(m_block)
        self.batch = scalar(batch)
        self.head = scalar(head)
        self.kv_head = scalar(kv_head)
        self.first_block = scalar(first_block)
        self.first_full = scalar(first_full)
        self.num_blocks = scalar(num_blocks)
        self.num_full = scalar(num_full)
        self.partial_ptr = scalar(partial_ptr)
        self.full_ptr = scalar(full_ptr)
        self.q_start = scalar(q_start)
        self.k_start = scalar(k_start)
        self.seqlen_q = scalar(seqlen_q)
        self.seqlen_k = scalar(seqlen_k)
        self.bits_first = scalar(bits_first)
