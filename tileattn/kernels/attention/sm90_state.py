"""The state the Hopper attention kernel's loader and consumers share (sm90.py,
sm90_consumers.py): the shared-memory rings of Q, K and V with their ready / empty mbarriers
and the ping-pong turn barriers (Rings), and FP8's descales (Descales; TileScales, one tile's).

No `from __future__ import annotations` here: Gluon checks aggregate fields against their
annotations at compile time, so the annotations must be classes, not strings.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier
from triton.language.core import _aggregate as aggregate

from ..gluon_common import Scalar, release, scalar
from .configs import DESCALE_BLOCK_ROWS
from .fwd import FP8_P_OFFSET

# FP8 P is exp2(s - max + P_OFFSET), inside e4m3's normal range (the portable kernel's rule).
P_OFFSET = gl.constexpr(FP8_P_OFFSET)
# Rows a block descale covers (q's, k's; configs.DESCALE_BLOCK_ROWS).
DESCALE_ROWS = gl.constexpr(DESCALE_BLOCK_ROWS)

# How a consumer sums P's rows (Rings.ROW_SUMS): in fp32 at every key step, reduced across the
# row's quad of threads by shuffles (REDUCED); as P @ 1, a wgmma of N = 8 beside P V (MMA); or
# in fp32, each thread its own columns across the key loop, the quad's reduction once a tile
# (PARTIAL). MMA and PARTIAL keep the sums in a [ROWS, 8] tensor (Consumer.l_layout).
ROW_SUMS_REDUCED = gl.constexpr(0)
ROW_SUMS_MMA = gl.constexpr(1)
ROW_SUMS_PARTIAL = gl.constexpr(2)


@aggregate
class Rings:
    """The shared memory of a program: Q's buffer and the K and V rings of NUM_STAGES tiles,
    each buffer with a ready / empty mbarrier pair, and the turn barriers of ping-pong
    consumers (one each, at least two). The tiles are [1, 1, rows, head dim], as TMA writes
    them; Q's buffer is [boxes, 1, 1, box rows, head dim]. With ROW_SUMS_MMA, ones_smem holds
    [8, BLOCK_N] ones with which P @ 1 sums P's rows on the tensor cores (Consumer.issue_pv);
    otherwise it names Q's buffer and is never read."""
    q_smem: gl.shared_memory_descriptor
    k_smem: gl.shared_memory_descriptor
    v_smem: gl.shared_memory_descriptor
    q_ready: gl.shared_memory_descriptor
    q_empty: gl.shared_memory_descriptor
    k_ready: gl.shared_memory_descriptor
    k_empty: gl.shared_memory_descriptor
    v_ready: gl.shared_memory_descriptor
    v_empty: gl.shared_memory_descriptor
    turn_bars: gl.shared_memory_descriptor
    ones_smem: gl.shared_memory_descriptor
    ROW_SUMS: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready,
                 v_empty, turn_bars, ones_smem, ROW_SUMS):
        self.q_smem = q_smem
        self.k_smem = k_smem
        self.v_smem = v_smem
        self.q_ready = q_ready
        self.q_empty = q_empty
        self.k_ready = k_ready
        self.k_empty = k_empty
        self.v_ready = v_ready
        self.v_empty = v_empty
        self.turn_bars = turn_bars
        self.ones_smem = ones_smem
        self.ROW_SUMS = gl.constexpr(ROW_SUMS)

    @gluon.jit
    def allocate(q_desc, k_desc, v_desc, NUM_STAGES: gl.constexpr, NUM_CONSUMERS: gl.constexpr,
                 Q_BOXES: gl.constexpr, ROW_SUMS: gl.constexpr):
        """Allocate and initialise; every consumer partition releases every buffer, so the
        empty barriers count NUM_CONSUMERS arrivals. Q's buffer holds Q_BOXES boxes of the
        descriptor's rows (TMA boxes are powers of two: a 192-row tile is 3 of 64)."""
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [Q_BOXES] + q_desc.block_type.shape,
                                           q_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [NUM_STAGES] + k_desc.block_type.shape,
                                           k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [NUM_STAGES] + v_desc.block_type.shape,
                                           v_desc.layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        TURNS: gl.constexpr = NUM_CONSUMERS if NUM_CONSUMERS > 2 else 2
        turn_bars = gl.allocate_shared_memory(gl.int64, [TURNS, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_ready, count=1)
        mbarrier.init(q_empty, count=NUM_CONSUMERS)
        for i in gl.static_range(TURNS):
            mbarrier.init(turn_bars.index(i), count=1)
        for i in gl.static_range(NUM_STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=NUM_CONSUMERS)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(v_empty.index(i), count=NUM_CONSUMERS)
        if ROW_SUMS == ROW_SUMS_MMA:
            BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
            BITS: gl.constexpr = k_desc.dtype.primitive_bitwidth
            SWIZZLE: gl.constexpr = 128 if BLOCK_N * BITS >= 1024 else BLOCK_N * BITS // 8
            fill: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [gl.num_warps(), 1], [1, 0])
            ones_smem = gl.allocate_shared_memory(
                k_desc.dtype, [8, BLOCK_N], gl.NVMMASharedLayout(SWIZZLE, BITS, 2),
                gl.full([8, BLOCK_N], 1.0, gl.float32, layout=fill).to(k_desc.dtype))
            fence_async_shared()
        else:
            ones_smem = q_smem
        return Rings(q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
                     turn_bars, ones_smem, ROW_SUMS)

    @gluon.jit
    def release(self, bar):
        """Arrive on a K/V empty or turn barrier, once for the warpgroup (a per-thread arrive
        that skips the warpgroup barrier before it lost 0-5%: docs/design.md)."""
        release(bar, False)

    @gluon.jit
    def k_operand(self, stage):
        """K^T [head dim, BLOCK_N] of the tile in `stage`: a K-major view of the tile."""
        BLOCK_N: gl.constexpr = self.k_smem.shape[3]
        HEAD_DIM: gl.constexpr = self.k_smem.shape[4]
        return self.k_smem.index(stage).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))

    @gluon.jit
    def ones_operand(self):
        """[BLOCK_N, 8] ones: the B operand of P @ 1 (ROW_SUMS_MMA), a K-major view."""
        return self.ones_smem.permute((1, 0))

    @gluon.jit
    def v_operand(self, stage):
        """V [BLOCK_N, padded head dim of V] of the tile in `stage`: the row-major tile, or for
        FP8 a K-major view of the [head dim, BLOCK_N] tile (8-bit wgmma reads B K-major only)."""
        if self.v_smem.dtype.primitive_bitwidth == 8:
            HEAD_DIM_V: gl.constexpr = self.v_smem.shape[3]
            BLOCK_N: gl.constexpr = self.v_smem.shape[4]
            view = self.v_smem.index(stage).reshape([HEAD_DIM_V, BLOCK_N]).permute((1, 0))
        else:
            BLOCK_N: gl.constexpr = self.v_smem.shape[3]
            HEAD_DIM_V: gl.constexpr = self.v_smem.shape[4]
            view = self.v_smem.index(stage).reshape([BLOCK_N, HEAD_DIM_V])
        return view


@aggregate
class TileScales:
    """A tile's FP8 descales: qk (q's, times k's unless K_BLOCKED) and v; with K_BLOCKED, k's
    row of block descales (one per DESCALE_ROWS keys, stride_kt apart)."""
    qk: Scalar
    v: Scalar
    k_row: Scalar
    stride_kt: Scalar
    K_BLOCKED: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, qk, v, k_row, stride_kt, K_BLOCKED):
        self.qk = scalar(qk)
        self.v = scalar(v)
        self.k_row = scalar(k_row)
        self.stride_kt = scalar(stride_kt)
        self.K_BLOCKED = gl.constexpr(K_BLOCKED)

    @gluon.jit
    def at(self, key_start):
        """The q·k descale of the key block starting at key_start (BLOCK_N divides
        DESCALE_ROWS, so a block lies in one descale block)."""
        if self.K_BLOCKED:
            qk = self.qk * gl.load(self.k_row + (key_start // DESCALE_ROWS) * self.stride_kt)
        else:
            qk = self.qk
        return qk


@aggregate
class Descales:
    """FP8's descales (FP8): q's per (batch, query head), k's and v's per (batch, kv head), read
    through strides (0 for a per-tensor scalar); q's and k's may also be per block of
    DESCALE_ROWS rows (stride_qt, and stride_kt with K_BLOCKED; a tile's BLOCK_M rows are one
    q block). q's and k's fold into the softmax scale, v's into the output's normalisation.
    V_KEYS_GROUPED: V's keys come in grouped order (layout.key_at_grouped_position)."""
    q_ptr: Scalar
    k_ptr: Scalar
    v_ptr: Scalar
    stride_qb: Scalar
    stride_qh: Scalar
    stride_qt: Scalar
    stride_kb: Scalar
    stride_kh: Scalar
    stride_kt: Scalar
    stride_vb: Scalar
    stride_vh: Scalar
    FP8: gl.constexpr
    K_BLOCKED: gl.constexpr
    V_KEYS_GROUPED: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, q_ptr, k_ptr, v_ptr, stride_qb, stride_qh, stride_qt, stride_kb,
                 stride_kh, stride_kt, stride_vb, stride_vh, FP8, K_BLOCKED, V_KEYS_GROUPED):
        self.q_ptr = scalar(q_ptr)
        self.k_ptr = scalar(k_ptr)
        self.v_ptr = scalar(v_ptr)
        self.stride_qb = scalar(stride_qb)
        self.stride_qh = scalar(stride_qh)
        self.stride_qt = scalar(stride_qt)
        self.stride_kb = scalar(stride_kb)
        self.stride_kh = scalar(stride_kh)
        self.stride_kt = scalar(stride_kt)
        self.stride_vb = scalar(stride_vb)
        self.stride_vh = scalar(stride_vh)
        self.FP8 = gl.constexpr(FP8)
        self.K_BLOCKED = gl.constexpr(K_BLOCKED)
        self.V_KEYS_GROUPED = gl.constexpr(V_KEYS_GROUPED)

    @gluon.jit
    def of_tile(self, tile):
        """The tile's TileScales; FP8 only."""
        qk = gl.load(self.q_ptr + tile.batch * self.stride_qb + tile.head * self.stride_qh
                     + tile.m_block * self.stride_qt)
        k_row = self.k_ptr + tile.batch * self.stride_kb + tile.kv_head * self.stride_kh
        if not self.K_BLOCKED:
            qk = qk * gl.load(k_row)
        v = gl.load(self.v_ptr + tile.batch * self.stride_vb + tile.kv_head * self.stride_vh)
        return TileScales(qk, v, k_row, self.stride_kt, self.K_BLOCKED)
