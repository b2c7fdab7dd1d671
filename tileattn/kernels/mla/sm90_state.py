"""The state of the Gluon MLA decode kernels (sm90.py for a 16-bit cache, sm90_fp8.py for e4m3)
that their partitions share, as Gluon aggregates: the shared memory (Buffers, allocated by the
kernel before it forks, with the Q load of the producer partitions), this program's work item,
the output pointers, the softmax's inputs and the page table. Pointer layouts are in the
kernels' docstrings.

No `from __future__ import annotations` here: Gluon checks aggregate fields against their
annotations, which must be classes, not strings.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.language.core import _aggregate as aggregate

from ..gluon_common import Scalar, scalar

BLOCK_M = gl.constexpr(64)            # rows per program: one wgmma M per warpgroup
BOX = gl.constexpr(64)                # TMA box width (columns); 576 = 9 boxes, V = boxes 0-7
NUM_BOXES = gl.constexpr(9)
V_BOXES = gl.constexpr(8)
V_BOXES_PER_WG = gl.constexpr(4)      # each consumer warpgroup owns 256 of V's 512 columns
LOG2_E = 1.4426950408889634


@aggregate
class Buffers:
    """Shared memory of both kernels: Q (9 boxes), the ring of NUM_STAGES 16-bit KV tiles of
    TILE_N keys (boxes 0-7, the 512 latent columns that are also V, and box 8, rope, apart
    because shared buffers need power-of-two inner dims), the P message (P and one fp32 per
    row), the softmax warpgroup's output scale per row (parked there across the key loops), and
    their barriers: q_ready, p_ready / p_empty, one kv_ready per box, kv_empty."""
    q_smem: gl.shared_memory_descriptor
    kv_smem: gl.shared_memory_descriptor
    rope_smem: gl.shared_memory_descriptor
    p_smem: gl.shared_memory_descriptor
    alpha_smem: gl.shared_memory_descriptor
    scale_smem: gl.shared_memory_descriptor
    q_ready: gl.shared_memory_descriptor
    p_ready: gl.shared_memory_descriptor
    p_empty: gl.shared_memory_descriptor
    kv_ready: gl.shared_memory_descriptor
    kv_empty: gl.shared_memory_descriptor
    NUM_STAGES: gl.constexpr
    TILE_N: gl.constexpr
    READY_SPLIT: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, q_smem, kv_smem, rope_smem, p_smem, alpha_smem, scale_smem, q_ready,
                 p_ready, p_empty, kv_ready, kv_empty, NUM_STAGES, TILE_N, READY_SPLIT):
        self.q_smem = q_smem
        self.kv_smem = kv_smem
        self.rope_smem = rope_smem
        self.p_smem = p_smem
        self.alpha_smem = alpha_smem
        self.scale_smem = scale_smem
        self.q_ready = q_ready
        self.p_ready = p_ready
        self.p_empty = p_empty
        self.kv_ready = kv_ready
        self.kv_empty = kv_empty
        self.NUM_STAGES = gl.constexpr(NUM_STAGES)
        self.TILE_N = gl.constexpr(TILE_N)
        self.READY_SPLIT = gl.constexpr(READY_SPLIT)

    @gluon.jit
    def allocate(q_desc, NUM_STAGES: gl.constexpr, TILE_N: gl.constexpr,
                 KV_READY_COUNT: gl.constexpr = 1, READY_SPLIT: gl.constexpr = 0):
        """Allocate and initialise (the kernel, before it forks into partitions). A box's
        "ready" barrier counts KV_READY_COUNT arrivals: 1 for a TMA's, or one per thread of a
        producer partition that writes the box itself. READY_SPLIT 0: one barrier per box;
        k > 0: boxes below k share box 0's barrier, the others box k's (see `ready`)."""
        dtype: gl.constexpr = q_desc.dtype
        tile_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, TILE_N, BOX], dtype)
        q_smem = gl.allocate_shared_memory(dtype, [NUM_BOXES] + q_desc.block_type.shape,
                                           q_desc.layout)
        kv_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES * V_BOXES, 1, TILE_N, BOX],
                                            tile_layout)
        rope_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, TILE_N, BOX], tile_layout)
        p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, TILE_N], dtype)
        p_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, TILE_N], p_layout)
        alpha_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_M],
                                               gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
        scale_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_M],
                                               gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
        q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        p_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        p_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        kv_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES * NUM_BOXES, 1],
                                             mbarrier.MBarrierLayout())
        kv_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_ready, count=1)
        mbarrier.init(p_ready, count=1)
        mbarrier.init(p_empty, count=1)
        for i in gl.static_range(NUM_STAGES):
            for c in gl.static_range(NUM_BOXES):
                mbarrier.init(kv_ready.index(i * NUM_BOXES + c), count=KV_READY_COUNT)
            mbarrier.init(kv_empty.index(i), count=2)   # both consumer warpgroups release a tile
        return Buffers(q_smem, kv_smem, rope_smem, p_smem, alpha_smem, scale_smem, q_ready,
                       p_ready, p_empty, kv_ready, kv_empty, NUM_STAGES, TILE_N, READY_SPLIT)

    @gluon.jit
    def load_q(self, q_desc, batch):
        """TMA of this program's 64 rows of Q (9 boxes, one barrier), from the producer."""
        mbarrier.expect(self.q_ready, NUM_BOXES * q_desc.block_type.nbytes)
        for c in gl.static_range(NUM_BOXES):
            tma.async_copy_global_to_shared(q_desc, [batch, gl.program_id(0) * BLOCK_M, c * BOX],
                                            self.q_ready, self.q_smem.index(c))

    @gluon.jit
    def ready(self, stage, c: gl.constexpr):
        """The barrier that fires once box c of the tile in `stage` has landed: its own, or
        its group's (READY_SPLIT: a producer that releases boxes in two groups arrives on
        two barriers, not nine, and each arrive costs it a warpgroup barrier)."""
        if self.READY_SPLIT == 0:
            return self.kv_ready.index(stage * NUM_BOXES + c)
        elif c < self.READY_SPLIT:
            return self.kv_ready.index(stage * NUM_BOXES)
        else:
            return self.kv_ready.index(stage * NUM_BOXES + self.READY_SPLIT)

    @gluon.jit
    def wait_tile(self, stage, phase):
        """Until every box of the tile in `stage` has landed."""
        for c in gl.static_range(NUM_BOXES):
            mbarrier.wait(self.ready(stage, c), phase)


@aggregate
class WorkItem:
    """This program's work item of the plan (tileattn.scheduler.mla: WORK_FIELDS = 5 columns):
    keys [kv_start, kv_end) of sequence `batch`, written to partial slot `slot` (< 0: the
    item is the whole sequence and writes out / lse directly). The fifth column, the seq_len
    the plan was made for, is read by planned_seq_len."""
    batch: Scalar
    kv_start: Scalar
    kv_end: Scalar
    slot: Scalar

    @gluon.constexpr_function
    def __init__(self, batch, kv_start, kv_end, slot):
        self.batch = scalar(batch)
        self.kv_start = scalar(kv_start)
        self.kv_end = scalar(kv_end)
        self.slot = scalar(slot)

    @gluon.jit
    def load(work_ptr):
        work_id = gl.program_id(1)
        batch = gl.load(work_ptr + work_id * 5)
        kv_start = gl.load(work_ptr + work_id * 5 + 1)
        kv_end = gl.load(work_ptr + work_id * 5 + 2)
        slot = gl.load(work_ptr + work_id * 5 + 3)
        return WorkItem(batch, kv_start, kv_end, slot)


@gluon.jit
def planned_seq_len(work_ptr):
    return gl.load(work_ptr + gl.program_id(1) * 5 + 4)


@aggregate
class Output:
    """Where both consumer warpgroups write their 256 columns: out [batch, q_len, num_heads,
    512] (strides stride_ob, stride_os, stride_oh) and lse [batch, q_len, num_heads] for an
    item that is a whole sequence, else the item's partial_out [slot, num_rows, 512] fp32 and
    partial_lse [slot, num_rows] slot (rows r = token * num_heads + head)."""
    out_ptr: Scalar
    lse_ptr: Scalar
    partial_out_ptr: Scalar
    partial_lse_ptr: Scalar
    stride_ob: Scalar
    stride_os: Scalar
    stride_oh: Scalar
    num_heads: Scalar
    num_rows: Scalar

    @gluon.constexpr_function
    def __init__(self, out_ptr, lse_ptr, partial_out_ptr, partial_lse_ptr, stride_ob, stride_os,
                 stride_oh, num_heads, num_rows):
        self.out_ptr = scalar(out_ptr)
        self.lse_ptr = scalar(lse_ptr)
        self.partial_out_ptr = scalar(partial_out_ptr)
        self.partial_lse_ptr = scalar(partial_lse_ptr)
        self.stride_ob = scalar(stride_ob)
        self.stride_os = scalar(stride_os)
        self.stride_oh = scalar(stride_oh)
        self.num_heads = scalar(num_heads)
        self.num_rows = scalar(num_rows)


@aggregate
class Scores:
    """What the softmax warpgroup needs beyond the tiles: seq_lens (the causal limit of each
    row, and the check that the plan was made for these lengths), q_len, the softmax scale
    (base 2) and the output scale, each times the FP8 descale *kv_descale_ptr when
    HAS_DESCALE; and PV_FIRST, the order of its key loop (sm90_consumers._softmax_loop)."""
    seq_lens_ptr: Scalar
    q_len: Scalar
    softmax_scale_log2: Scalar
    output_scale: Scalar
    kv_descale_ptr: Scalar
    HAS_DESCALE: gl.constexpr
    PV_FIRST: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, seq_lens_ptr, q_len, softmax_scale_log2, output_scale, kv_descale_ptr,
                 HAS_DESCALE, PV_FIRST):
        self.seq_lens_ptr = scalar(seq_lens_ptr)
        self.q_len = scalar(q_len)
        self.softmax_scale_log2 = scalar(softmax_scale_log2)
        self.output_scale = scalar(output_scale)
        self.kv_descale_ptr = scalar(kv_descale_ptr)
        self.HAS_DESCALE = gl.constexpr(HAS_DESCALE)
        self.PV_FIRST = gl.constexpr(PV_FIRST)


@aggregate
class Pages:
    """The paged cache's page table, [batch, pages per sequence] int32 (row stride
    stride_page_table_b), of pages of PAGE_SIZE tokens."""
    page_table_ptr: Scalar
    stride_page_table_b: Scalar
    PAGE_SIZE: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, page_table_ptr, stride_page_table_b, PAGE_SIZE):
        self.page_table_ptr = scalar(page_table_ptr)
        self.stride_page_table_b = scalar(stride_page_table_b)
        self.PAGE_SIZE = gl.constexpr(PAGE_SIZE)

    @gluon.jit
    def row(self, batch):
        """Sequence `batch`'s page ids."""
        return self.page_table_ptr + batch.to(gl.int64) * self.stride_page_table_b


@gluon.jit
def box_view(smem, i):
    """Box i of a [n, 1, rows, 64] buffer as a [rows, 64] tile."""
    return smem.index(i).reshape([smem.shape[2], smem.shape[3]])
