"""The Hopper attention kernel's epilogue (sm90_consumers.py's partitions call store_tile):
O normalised by its row sums (FP8: and V's descale) and written by register stores, 16-byte row
pieces through shared memory, or a TMA copy (Output), and the lse.

No `from __future__ import annotations` here: Gluon checks aggregate fields against their
annotations at compile time, so the annotations must be classes, not strings.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, tma
from triton.language.core import _aggregate as aggregate

from ..gluon_common import Scalar, scalar
from .sm90_state import P_OFFSET


@aggregate
class Output:
    """Where the epilogue writes: out (OUT_DIM columns, V's head dim; the tile may be wider, its
    padding is not stored) and, with RETURN_LSE, lse ([batch, heads, seqlen_q], or with VARLEN
    packed [heads, total_q]: a head's row lse_stride_h long). WIDE_STORE (16-bit out): O goes
    through shared memory into 16-byte row pieces a thread; the accumulator's own layout stores
    4 bytes at a time, and those stores held the epilogue up (docs/design.md, "Hopper forward
    kernel"). TMA_STORE (dense 16-bit out of a 64-row consumer): O goes into o_smem (a buffer a
    consumer) and out by a TMA copy that the consumer does not wait for until its next tile's
    epilogue; o_desc views out as [batch, heads, seqlen_q, OUT_DIM] in 64-row boxes (else both
    are None)."""
    out_ptr: gl.tensor
    stride_ob: Scalar
    stride_os: Scalar
    stride_oh: Scalar
    lse_ptr: Scalar
    lse_stride_h: Scalar
    OUT_DIM: gl.constexpr
    RETURN_LSE: gl.constexpr
    WIDE_STORE: gl.constexpr
    o_desc: tma.tensor_descriptor | gl.constexpr
    o_smem: gl.shared_memory_descriptor | gl.constexpr
    TMA_STORE: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, out_ptr, stride_ob, stride_os, stride_oh, lse_ptr, lse_stride_h, OUT_DIM,
                 RETURN_LSE, WIDE_STORE, o_desc, o_smem):
        self.out_ptr = out_ptr
        self.stride_ob = scalar(stride_ob)
        self.stride_os = scalar(stride_os)
        self.stride_oh = scalar(stride_oh)
        self.lse_ptr = scalar(lse_ptr)
        self.lse_stride_h = scalar(lse_stride_h)
        self.OUT_DIM = gl.constexpr(OUT_DIM)
        self.RETURN_LSE = gl.constexpr(RETURN_LSE)
        self.WIDE_STORE = gl.constexpr(WIDE_STORE)
        self.TMA_STORE = gl.constexpr(o_smem is not None)
        self.o_desc = o_desc if self.TMA_STORE else gl.constexpr(None)
        self.o_smem = o_smem if self.TMA_STORE else gl.constexpr(None)


@gluon.jit
def store_tile(acc, m_i, l_i, rows, tile, output, wg, scales):
    """Normalise O (FP8: and apply V's descale) and write this partition's rows of the tile
    (and their LSE)."""
    problem = wg.problem
    o_rows: gl.constexpr = gl.SliceLayout(1, wg.o_layout)
    l_i = wg.row_sums(l_i)
    # Rows that see no key at all (seqlen_q > seqlen_k under causal) output 0, lse -inf.
    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    if wg.FP8:
        acc = acc * gl.expand_dims(gl.convert_layout(scales.v / l_safe, o_rows), 1)
    else:
        acc = acc * gl.expand_dims(gl.convert_layout(1.0 / l_safe, o_rows), 1)
    values = acc.to(output.out_ptr.dtype.element_ty)
    if output.TMA_STORE:
        buffer = output.o_smem.index(wg.HALF)
        # This consumer's previous tile has left the buffer (the copy's issuing thread waits;
        # the barrier holds the others).
        tma.store_wait(0)
        gl.thread_barrier()
        buffer.reshape([wg.ROWS, wg.HEAD_DIM_V]).store(values)
        fence_async_shared()
        gl.thread_barrier()
        row = tile.m_block * problem.BLOCK_M + wg.HALF * wg.ROWS     # dense: from row 0
        tma.async_copy_shared_to_global(output.o_desc, [tile.batch, tile.head, row, 0], buffer)
    elif output.WIDE_STORE:
        # The accumulator's thread holds 2 adjacent columns in 8; 8 adjacent ones here.
        # wgmma gives each warp 16 of the partition's rows: ROWS // 16 warps.
        COLUMN_THREADS: gl.constexpr = wg.HEAD_DIM_V // 8
        store_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // COLUMN_THREADS,
                                                               COLUMN_THREADS],
                                                      [wg.ROWS // 16, 1], [1, 0])
        values = gl.convert_layout(values, store_layout)
        _write_out(values, tile, output, wg, store_layout)
    else:
        _write_out(values, tile, output, wg, wg.o_layout)
    if output.RETURN_LSE:
        log2_l = gl.log2(l_safe)
        if wg.FP8:
            log2_l = log2_l - P_OFFSET     # p and l carry 2^P_OFFSET
        lse = gl.where(l_i == 0.0, float("-inf"), (m_i + log2_l) * 0.6931471805599453)
        if problem.VARLEN:
            lse_ptrs = (output.lse_ptr + tile.head.to(gl.int64) * output.lse_stride_h
                        + tile.q_start + rows)
        else:
            batch_head = tile.batch * problem.num_q_heads + tile.head
            lse_ptrs = output.lse_ptr + batch_head.to(gl.int64) * problem.seqlen_q + rows
        gl.store(lse_ptrs, lse, mask=rows < tile.seqlen_q)


@gluon.jit
def _write_out(values, tile, output, wg, layout: gl.constexpr):
    """Store this partition's ROWS x HEAD_DIM_V tile of out, values in `layout`."""
    out_rows = (tile.m_block * wg.problem.BLOCK_M + wg.HALF * wg.ROWS
                + gl.arange(0, wg.ROWS, layout=gl.SliceLayout(1, layout)))
    out_cols = gl.arange(0, wg.HEAD_DIM_V, layout=gl.SliceLayout(0, layout))
    out_ptrs = (output.out_ptr + tile.batch.to(gl.int64) * output.stride_ob
                + tile.head.to(gl.int64) * output.stride_oh
                + gl.expand_dims((tile.q_start + out_rows).to(gl.int64) * output.stride_os, 1)
                + gl.expand_dims(out_cols, 0))
    out_mask = gl.expand_dims(out_rows < tile.seqlen_q, 1)
    if output.OUT_DIM != wg.HEAD_DIM_V:
        out_mask = out_mask & gl.expand_dims(out_cols < output.OUT_DIM, 0)
    gl.store(out_ptrs, values, mask=out_mask)
