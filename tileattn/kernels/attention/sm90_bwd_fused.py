"""The Hopper (sm90) attention backward in one Gluon kernel: dK and dV as sm90_bwd.py's dK/dV
kernel, and dQ added by TMA reductions into an fp32 buffer (FlashAttention-3's split of roles),
so a backward runs five products where the dK/dV kernel plus the dQ pass run seven.

A program owns BLOCK_N = 128 keys of one (sequence, kv head) and walks the query tiles
(BLOCK_M rows) of its GQA group's heads, head-major. Four partitions:
  * two compute warpgroups (HALF 0 and 1), each the 64 keys of its half: per query tile
        sᵀ = K Qᵀ, dPᵀ = V dOᵀ, Pᵀ = exp2(sᵀ·scale·log2 e − lse·log2 e),
        dV += Pᵀ dO, dSᵀ = Pᵀ ∘ (dPᵀ − delta), dK += dSᵀ Q        (its 64 keys)
        dQ[:, half's columns] = dS K[:, half's columns]            (all 128 keys)
    or, with ALTERNATE_DQ, all of dQ = dS K on every other step (warpgroup i % 2 at step i);
    dSᵀ goes through shared memory (each warpgroup writes its 64 key rows; dS K reads all of
    it as its transposed A operand), dQ through one of two fp32 buffers;
  * a loader warp: K and V once, then Q, dO, lse and delta of each query tile into a ring of
    NUM_STAGES stages (ready / empty mbarriers);
  * a dQ warp: one TMA reduction (add) a query tile from the buffer the warpgroups filled into
    dq_accum, the buffer released once the reduction has read it.
The order of dQ's additions across programs is not fixed: not deterministic.

Scope (supports()): dense inputs as sm90_bwd.supports()'s with lse TMA-addressable (seqlen_q a
multiple of 4), or packed varlen ones; causal (bottom-right) or not; FUSED_CONFIGS' padded head
dims (64, 128; Dv padded alike). Dense query rows past the end read zeros for Q, dO, lse and
delta (TMA's fill): with dO = 0 they add nothing; key rows past the end are computed, never
stored. Packed tiles that reach into the next sequence's rows or keys set P = 0 there.
dq_accum: fp32 with q's shape, contiguous, zeroed, or written first by key block 0's own launch
(fused_sm90_launch's part "first", whose dQ warp stores where the others add); dq =
softmax_scale · dq_accum afterwards (bwd.py's convert kernel).

No `from __future__ import annotations` here (Gluon reads annotations as classes).
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
from triton.language.core import _aggregate as aggregate

from ..gluon_common import Scalar, release, scalar, tma_reduce_add, tma_ready
from ..runtime import KernelLaunch
from .configs import padded_head_dim
from .sm90 import LOG2_E, _descriptor
from . import sm90_bwd
from .sm90_bwd import _a_operand_layout, _barriers, _mma_layout, _store_rows, lse_base2, width

# Padded head dim -> (keys a program (64 a compute warpgroup), queries a step, Q/dO ring stages).
FUSED_CONFIGS = {64: (128, 64, 2), 128: (128, 64, 2)}
# Per (padded head dim, causal), what measured faster there and slower elsewhere
# (docs/design.md, "Backward"): the compute warpgroups release the Q/dO stage and dSᵀ's buffer
# by each thread's arrive; they hold their K and V rows in registers, the A operands of sᵀ and
# dPᵀ, which saves shared-memory reads (at D=128 they spill).
PER_THREAD_RELEASE = {(128, True)}
KV_IN_REGISTERS = {(64, False)}
# Without a causal mask the warpgroups take turns at dQ: step i's whole dQ = dS K (N = D) is
# computed by warpgroup i % 2, which reads dS and K once instead of each reading all of dS for
# its half of the columns (N = D / 2); the other goes straight on to dK and the next step.
ALTERNATE_DQ = {(64, False)}
# Padded head dims whose dense calls without a mask run as two launches, key block 0 then the
# rest: the first stores each query tile's dQ, which every later block's reduction then adds
# to, so the fp32 buffer needs no zeroing (bwd.backward_launches; fused_sm90_launch's part).
# Under a causal mask it gained nothing (docs/design.md, "Backward"): one launch adds there.
FIRST_BLOCK_STORES = {64, 128}
COMPUTE_REGS = gl.constexpr(240)
WORKER_REGS = gl.constexpr(24)


@aggregate
class Work:
    """What every partition knows of its program: the (sequence, kv head) and the 128 keys
    (from start_n) it owns, the steps it walks (total = steps_per_head query tiles from first_m,
    for each head of the GQA group, head-major), where the sequence starts in the (packed)
    tensors (q_start, k_start), its lengths and bottom-right shift, the softmax scale, and
    `zero`, a runtime 0 (see `kept`). PER_THREAD_RELEASE, KV_REGS and ALT_DQ: the options of
    PER_THREAD_RELEASE, KV_IN_REGISTERS and ALTERNATE_DQ; DQ_STORE: dQ tiles are stored, not
    added (the first key block's launch: fused_sm90_launch's part)."""
    batch: Scalar
    kv_head: Scalar
    start_n: Scalar
    first_m: Scalar
    steps_per_head: Scalar
    total: Scalar
    gqa_group_size: Scalar
    seqlen_q: Scalar
    seqlen_k: Scalar
    q_start: Scalar
    k_start: Scalar
    shift: Scalar
    softmax_scale: Scalar
    softmax_scale_log2: Scalar
    zero: Scalar
    CAUSAL: gl.constexpr
    VARLEN: gl.constexpr
    PER_THREAD_RELEASE: gl.constexpr
    KV_REGS: gl.constexpr
    ALT_DQ: gl.constexpr
    DQ_STORE: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, batch, kv_head, start_n, first_m, steps_per_head, total, gqa_group_size,
                 seqlen_q, seqlen_k, q_start, k_start, shift, softmax_scale, softmax_scale_log2,
                 zero, CAUSAL, VARLEN, PER_THREAD_RELEASE, KV_REGS, ALT_DQ, DQ_STORE):
        self.batch = scalar(batch)
        self.kv_head = scalar(kv_head)
        self.start_n = scalar(start_n)
        self.first_m = scalar(first_m)
        self.steps_per_head = scalar(steps_per_head)
        self.total = scalar(total)
        self.gqa_group_size = scalar(gqa_group_size)
        self.seqlen_q = scalar(seqlen_q)
        self.seqlen_k = scalar(seqlen_k)
        self.q_start = scalar(q_start)
        self.k_start = scalar(k_start)
        self.shift = scalar(shift)
        self.softmax_scale = scalar(softmax_scale)
        self.softmax_scale_log2 = scalar(softmax_scale_log2)
        self.zero = scalar(zero)
        self.CAUSAL = gl.constexpr(CAUSAL)
        self.VARLEN = gl.constexpr(VARLEN)
        self.PER_THREAD_RELEASE = gl.constexpr(PER_THREAD_RELEASE)
        self.KV_REGS = gl.constexpr(KV_REGS)
        self.ALT_DQ = gl.constexpr(ALT_DQ)
        self.DQ_STORE = gl.constexpr(DQ_STORE)

    @gluon.jit
    def step_coords(self, i, BLOCK_M: gl.constexpr):
        """(query head, first query row within the sequence) of step i."""
        head = self.kv_head * self.gqa_group_size + i // self.steps_per_head
        return head, (self.first_m + i % self.steps_per_head) * BLOCK_M


@aggregate
class Rings:
    """The program's shared memory: K and V (loaded once), the Q/dO/lse/delta ring of
    NUM_STAGES stages (ready / empty), dSᵀ of both warpgroups (ds_ready / ds_free), and two fp32
    dQ buffers (dq_full / dq_empty). Tiles are [1, 1, rows, head dim] as TMA writes them; K, V
    and dSᵀ have a leading dim of 1, which the compute warpgroups index (see `kept`)."""
    k_smem: gl.shared_memory_descriptor
    v_smem: gl.shared_memory_descriptor
    q_smem: gl.shared_memory_descriptor
    do_smem: gl.shared_memory_descriptor
    lse_smem: gl.shared_memory_descriptor
    delta_smem: gl.shared_memory_descriptor
    ds_smem: gl.shared_memory_descriptor
    dq_smem: gl.shared_memory_descriptor
    kv_ready: gl.shared_memory_descriptor
    ready: gl.shared_memory_descriptor
    empty: gl.shared_memory_descriptor
    ds_ready: gl.shared_memory_descriptor
    ds_free: gl.shared_memory_descriptor
    dq_full: gl.shared_memory_descriptor
    dq_empty: gl.shared_memory_descriptor

    @gluon.constexpr_function
    def __init__(self, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem,
                 kv_ready, ready, empty, ds_ready, ds_free, dq_full, dq_empty):
        self.k_smem = k_smem
        self.v_smem = v_smem
        self.q_smem = q_smem
        self.do_smem = do_smem
        self.lse_smem = lse_smem
        self.delta_smem = delta_smem
        self.ds_smem = ds_smem
        self.dq_smem = dq_smem
        self.kv_ready = kv_ready
        self.ready = ready
        self.empty = empty
        self.ds_ready = ds_ready
        self.ds_free = ds_free
        self.dq_full = dq_full
        self.dq_empty = dq_empty

    @gluon.jit
    def allocate(q_desc, k_desc, v_desc, do_desc, dq_desc, NUM_STAGES: gl.constexpr,
                 PER_THREAD_RELEASE: gl.constexpr, ALT_DQ: gl.constexpr):
        """Allocate and initialise. The compute warpgroups' "done reading" barriers (empty,
        ds_free) take an arrival from each warpgroup, or with PER_THREAD_RELEASE from each of
        their threads; with ALT_DQ dSᵀ has one reader a step and a dQ buffer one writer."""
        BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
        BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
        dtype: gl.constexpr = q_desc.dtype
        k_smem = gl.allocate_shared_memory(dtype, [1] + k_desc.block_type.shape, k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [1] + v_desc.block_type.shape, v_desc.layout)
        q_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + q_desc.block_type.shape,
                                           q_desc.layout)
        do_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + do_desc.block_type.shape,
                                            do_desc.layout)
        # A stage's lse and delta rows: [1, 1, BLOCK_M] as TMA's box (packed: the loader's
        # stores).
        rows_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0,
                                                         element_bitwidth=32, rank=3)
        lse_smem = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, 1, 1, BLOCK_M],
                                             rows_layout)
        delta_smem = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, 1, 1, BLOCK_M],
                                               rows_layout)
        ds_smem = gl.allocate_shared_memory(
            dtype, [1, BLOCK_N, BLOCK_M],
            gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype))
        dq_smem = gl.allocate_shared_memory(gl.float32, [2] + dq_desc.block_type.shape,
                                            dq_desc.layout)
        RELEASES: gl.constexpr = 256 if PER_THREAD_RELEASE else 2
        kv_ready = _barriers(1)
        ready = _barriers(NUM_STAGES)
        empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(NUM_STAGES):
            mbarrier.init(empty.index(s), count=RELEASES)
        ds_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        ds_free = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        mbarrier.init(ds_ready.index(0), count=2)
        mbarrier.init(ds_free.index(0), count=RELEASES // 2 if ALT_DQ else RELEASES)
        dq_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        dq_empty = _barriers(2)
        for b in gl.static_range(2):
            mbarrier.init(dq_full.index(b), count=1 if ALT_DQ else 2)
        return Rings(k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem,
                     kv_ready, ready, empty, ds_ready, ds_free, dq_full, dq_empty)


@aggregate
class Grads:
    """Where dK and dV go: [batch, seqlen, kv heads, head dim] strides (packed: batch stride
    0), the first HEAD_DIM / HEAD_DIM_V columns (the rest is the tiles' padding)."""
    dk_ptr: gl.tensor
    dv_ptr: gl.tensor
    stride_dkb: Scalar
    stride_dks: Scalar
    stride_dkh: Scalar
    stride_dvb: Scalar
    stride_dvs: Scalar
    stride_dvh: Scalar
    HEAD_DIM: gl.constexpr
    HEAD_DIM_V: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, dk_ptr, dv_ptr, stride_dkb, stride_dks, stride_dkh, stride_dvb,
                 stride_dvs, stride_dvh, HEAD_DIM, HEAD_DIM_V):
        self.dk_ptr = dk_ptr
        self.dv_ptr = dv_ptr
        self.stride_dkb = scalar(stride_dkb)
        self.stride_dks = scalar(stride_dks)
        self.stride_dkh = scalar(stride_dkh)
        self.stride_dvb = scalar(stride_dvb)
        self.stride_dvs = scalar(stride_dvs)
        self.stride_dvh = scalar(stride_dvh)
        self.HEAD_DIM = gl.constexpr(HEAD_DIM)
        self.HEAD_DIM_V = gl.constexpr(HEAD_DIM_V)


@aggregate
class Inputs:
    """What the loader warp reads: TMA descriptors of q, k, v, dout (and lse, delta when dense;
    None when packed), and the lse and delta rows [num_q_heads, total_q] it loads itself when
    packed."""
    q_desc: tma.tensor_descriptor
    k_desc: tma.tensor_descriptor
    v_desc: tma.tensor_descriptor
    do_desc: tma.tensor_descriptor
    lse_desc: tma.tensor_descriptor | gl.constexpr
    delta_desc: tma.tensor_descriptor | gl.constexpr
    lse_ptr: gl.tensor
    delta_ptr: gl.tensor
    total_q: Scalar

    @gluon.constexpr_function
    def __init__(self, q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, lse_ptr,
                 delta_ptr, total_q):
        self.q_desc = q_desc
        self.k_desc = k_desc
        self.v_desc = v_desc
        self.do_desc = do_desc
        self.lse_desc = lse_desc if lse_desc is not None else gl.constexpr(None)
        self.delta_desc = delta_desc if delta_desc is not None else gl.constexpr(None)
        self.lse_ptr = lse_ptr
        self.delta_ptr = delta_ptr
        self.total_q = scalar(total_q)


@gluon.jit
def _loader_partition(work, rings, inputs):
    """TMA copies: K and V once, then every step's Q, dO, lse and delta into its ring stage.
    Packed (VARLEN) lse and delta rows start anywhere, and TMA needs their innermost coordinate
    16-byte aligned: this warp loads them (inputs.lse_ptr, delta_ptr) and stores them to the
    stage before the stage's barrier arrival, which publishes them."""
    q_desc = inputs.q_desc
    k_desc = inputs.k_desc
    v_desc = inputs.v_desc
    do_desc = inputs.do_desc
    total_q = inputs.total_q
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    NUM_STAGES: gl.constexpr = rings.q_smem.shape[0]
    batch = work.batch
    kv_ready = rings.kv_ready.index(0)
    mbarrier.expect(kv_ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [batch, work.kv_head, work.k_start + work.start_n, 0],
                                    kv_ready, rings.k_smem.index(0))
    tma.async_copy_global_to_shared(v_desc, [batch, work.kv_head, work.k_start + work.start_n, 0],
                                    kv_ready, rings.v_smem.index(0))
    for i in range(work.total):
        stage = i % NUM_STAGES
        head, row = work.step_coords(i, BLOCK_M)
        row += work.q_start
        mbarrier.wait(rings.empty.index(stage), ((i // NUM_STAGES) & 1) ^ 1)
        bar = rings.ready.index(stage)
        if work.VARLEN:
            layout: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
            rows = row + gl.arange(0, BLOCK_M, layout=layout)
            at = head.to(gl.int64) * total_q + rows
            inside = rows < total_q
            rings.lse_smem.index(stage).reshape([BLOCK_M]).store(
                gl.load(inputs.lse_ptr + at, mask=inside, other=0.0))
            rings.delta_smem.index(stage).reshape([BLOCK_M]).store(
                gl.load(inputs.delta_ptr + at, mask=inside, other=0.0))
            mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        else:
            mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes
                            + inputs.lse_desc.block_type.nbytes
                            + inputs.delta_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(inputs.lse_desc, [batch, head, row], bar,
                                            rings.lse_smem.index(stage))
            tma.async_copy_global_to_shared(inputs.delta_desc, [batch, head, row], bar,
                                            rings.delta_smem.index(stage))
        tma.async_copy_global_to_shared(q_desc, [batch, head, row, 0], bar,
                                        rings.q_smem.index(stage))
        tma.async_copy_global_to_shared(do_desc, [batch, head, row, 0], bar,
                                        rings.do_smem.index(stage))


@gluon.jit
def _dq_partition(work, rings, dq_desc):
    """One TMA reduction (with DQ_STORE a TMA store) a step from the dQ buffer both warpgroups
    filled; a buffer is released once its reduction has read it (the next step's reduction
    issued first)."""
    BLOCK_M: gl.constexpr = dq_desc.block_type.shape[2]
    for i in range(work.total):
        buffer = i % 2
        head, row = work.step_coords(i, BLOCK_M)
        mbarrier.wait(rings.dq_full.index(buffer), (i // 2) & 1)
        coord = [work.batch, head, work.q_start + row, 0]
        if work.DQ_STORE:
            tma.async_copy_shared_to_global(dq_desc, coord, rings.dq_smem.index(buffer))
        else:
            tma_reduce_add(dq_desc, coord, rings.dq_smem.index(buffer))
        tma.store_wait(1)
        if i > 0:
            mbarrier.arrive(rings.dq_empty.index(1 - buffer), count=1)
    tma.store_wait(0)


@gluon.jit
def _hand_dq(dq, rings, i, HALF: gl.constexpr):
    """Step i's dQ columns of warpgroup HALF (all of them when dq is D wide: ALT_DQ) into dQ
    buffer i % 2 for the dQ warp."""
    BLOCK_M: gl.constexpr = rings.dq_smem.shape[3]
    D: gl.constexpr = rings.dq_smem.shape[4]
    buffer = i % 2
    mbarrier.wait(rings.dq_empty.index(buffer), ((i // 2) & 1) ^ 1)
    tile = rings.dq_smem.index(buffer).reshape([BLOCK_M, D])
    if dq.shape[1] == D:
        tile.store(dq)
    else:
        tile.slice(HALF * (D // 2), D // 2, dim=1).store(dq)
    fence_async_shared()
    mbarrier.arrive(rings.dq_full.index(buffer), count=1)


@gluon.jit
def _compute_partition(work, rings, grads, HALF: gl.constexpr):
    """Compute warpgroup HALF: keys start_n + 64·HALF.. of the program (module docstring);
    positions are the sequence's, its first key at row k_start of dk and dv."""
    k_smem = rings.k_smem
    v_smem = rings.v_smem
    q_smem = rings.q_smem
    do_smem = rings.do_smem
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    D: gl.constexpr = k_smem.shape[4]
    DV: gl.constexpr = v_smem.shape[4]
    NUM_STAGES: gl.constexpr = q_smem.shape[0]
    ROWS: gl.constexpr = BLOCK_N // 2
    dtype: gl.constexpr = k_smem.dtype
    s_layout: gl.constexpr = _mma_layout(4, BLOCK_M, dtype)
    dk_layout: gl.constexpr = _mma_layout(4, D, dtype)
    dv_layout: gl.constexpr = _mma_layout(4, DV, dtype)
    dq_layout: gl.constexpr = _mma_layout(4, D // 2, dtype)
    seqlen_q = work.seqlen_q
    seqlen_k = work.seqlen_k
    shift = work.shift

    first_key = work.start_n + HALF * ROWS
    keys = first_key + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
    s_zero = gl.zeros([ROWS, BLOCK_M], gl.float32, layout=s_layout)
    dq_zero = gl.zeros([BLOCK_M, D // 2], gl.float32, layout=dq_layout)
    dq_whole_zero = gl.zeros([BLOCK_M, D], gl.float32, layout=dk_layout)
    dk = gl.zeros([ROWS, D], gl.float32, layout=dk_layout)
    dv = gl.zeros([ROWS, DV], gl.float32, layout=dv_layout)
    mbarrier.wait(rings.kv_ready.index(0), 0)
    if work.KV_REGS:
        # This warpgroup's K and V rows, loaded once: the A operands of sᵀ and dPᵀ.
        k_regs = k_smem.index(0).reshape([BLOCK_N, D]).slice(HALF * ROWS, ROWS, dim=0).load(
            _a_operand_layout(s_layout, dtype))
        v_regs = v_smem.index(0).reshape([BLOCK_N, DV]).slice(HALF * ROWS, ROWS, dim=0).load(
            _a_operand_layout(s_layout, dtype))
    for i in range(work.total):
        stage = i % NUM_STAGES
        first_q = (work.first_m + i % work.steps_per_head) * BLOCK_M
        # The operands that stay are addressed from `kept` = min(i, zero) = 0, which the
        # compiler cannot hoist: hoisted, their wgmma descriptors (32 a warpgroup) held
        # registers across the loop and spilled.
        kept = gl.minimum(i, work.zero)
        k_tile = k_smem.index(kept).reshape([BLOCK_N, D])
        # sᵀ's and dPᵀ's shared-memory A operands (unused with KV_REGS; defined here, where
        # the other variants' measured schedules have them).
        k_op = k_tile.slice(HALF * ROWS, ROWS, dim=0)
        v_op = v_smem.index(kept).reshape([BLOCK_N, DV]).slice(HALF * ROWS, ROWS, dim=0)
        k_columns = k_tile.slice(HALF * (D // 2), D // 2, dim=1)
        ds_tile = rings.ds_smem.index(kept)
        ds_rows = ds_tile.slice(HALF * ROWS, ROWS, dim=0)
        mbarrier.wait(rings.ready.index(stage), (i // NUM_STAGES) & 1)
        q_op = q_smem.index(stage).reshape([BLOCK_M, D])
        do_op = do_smem.index(stage).reshape([BLOCK_M, DV])
        if work.KV_REGS:
            s_t = warpgroup_mma(k_regs, q_op.permute((1, 0)), s_zero, use_acc=False,
                                is_async=True)
            dp_t = warpgroup_mma(v_regs, do_op.permute((1, 0)), s_zero, use_acc=False,
                                 is_async=True)
        else:
            s_t = warpgroup_mma(k_op, q_op.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            dp_t = warpgroup_mma(v_op, do_op.permute((1, 0)), s_zero, use_acc=False,
                                 is_async=True)
        s_t = warpgroup_mma_wait(1, deps=(s_t,))
        lse_log2 = lse_base2(rings.lse_smem.index(stage).reshape([BLOCK_M]).load(
            gl.SliceLayout(0, s_layout)))
        p_t = gl.exp2(s_t * work.softmax_scale_log2 - gl.expand_dims(lse_log2, 0))
        if work.CAUSAL:
            # Only tiles whose first query misses this half's last key cross the diagonal.
            if first_q + shift < first_key + ROWS - 1:
                queries = first_q + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
                visible = gl.expand_dims(keys, 1) <= gl.expand_dims(queries + shift, 0)
                p_t = gl.where(visible, p_t, 0.0)
        if work.VARLEN:
            # A tile crossing the sequence's end holds the next one's rows or keys: P = 0.
            if (first_q + BLOCK_M > seqlen_q) | (first_key + ROWS > seqlen_k):
                queries = first_q + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
                inside = (gl.expand_dims(keys, 1) < seqlen_k) & (gl.expand_dims(queries, 0)
                                                                 < seqlen_q)
                p_t = gl.where(inside, p_t, 0.0)
        dv = warpgroup_mma(gl.convert_layout(p_t.to(dtype), _a_operand_layout(dv_layout, dtype)),
                           do_op, dv, is_async=True)
        delta = rings.delta_smem.index(stage).reshape([BLOCK_M]).load(
            gl.SliceLayout(0, s_layout))
        # Groups retire in order: one in flight (dV) means dPᵀ is done.
        dp_t = warpgroup_mma_wait(1, deps=(dp_t,))
        ds_t = (p_t * (dp_t - gl.expand_dims(delta, 0))).to(dtype)
        # dSᵀ's buffer: the last step's dS K (both warpgroups', or ALT_DQ's one) has read it.
        mbarrier.wait(rings.ds_free.index(0), (i & 1) ^ 1)
        ds_rows.store(ds_t)
        fence_async_shared()
        mbarrier.arrive(rings.ds_ready.index(0), count=1)
        dk_operand = gl.convert_layout(ds_t, _a_operand_layout(dk_layout, dtype))
        if work.ALT_DQ:
            # dQ in turns: this warpgroup's steps compute all of dQ, under which dK runs; on
            # the other's steps it needs no dSᵀ of the other warpgroup.
            dk = warpgroup_mma(dk_operand, q_op, dk, is_async=True)
            if (i & 1) == HALF:
                mbarrier.wait(rings.ds_ready.index(0), i & 1)
                dq = warpgroup_mma(ds_tile.permute((1, 0)), k_tile, dq_whole_zero,
                                   use_acc=False, is_async=True)
                dq = warpgroup_mma_wait(0, deps=(dq,))
                release(rings.ds_free.index(0), work.PER_THREAD_RELEASE)
                _hand_dq(dq, rings, i, HALF)
            dv, dk = warpgroup_mma_wait(0, deps=(dv, dk))
            release(rings.empty.index(stage), work.PER_THREAD_RELEASE)
        elif work.CAUSAL:
            # Under a causal mask dK goes first and runs while this warpgroup waits for the
            # other's dSᵀ; without one, dQ first measured faster (docs/design.md, "Backward").
            dk = warpgroup_mma(dk_operand, q_op, dk, is_async=True)
            mbarrier.wait(rings.ds_ready.index(0), i & 1)
            dq = warpgroup_mma(ds_tile.permute((1, 0)), k_columns, dq_zero, use_acc=False,
                               is_async=True)
            dv, dk, dq = warpgroup_mma_wait(0, deps=(dv, dk, dq))
            release(rings.ds_free.index(0), work.PER_THREAD_RELEASE)
            release(rings.empty.index(stage), work.PER_THREAD_RELEASE)
            _hand_dq(dq, rings, i, HALF)
        else:
            # dQ first: dK runs while dQ goes through shared memory to the dQ warp.
            mbarrier.wait(rings.ds_ready.index(0), i & 1)
            dq = warpgroup_mma(ds_tile.permute((1, 0)), k_columns, dq_zero, use_acc=False,
                               is_async=True)
            dk = warpgroup_mma(dk_operand, q_op, dk, is_async=True)
            dv, dq = warpgroup_mma_wait(1, deps=(dv, dq))
            release(rings.ds_free.index(0), work.PER_THREAD_RELEASE)
            _hand_dq(dq, rings, i, HALF)
            dk = warpgroup_mma_wait(0, deps=(dk,))
            release(rings.empty.index(stage), work.PER_THREAD_RELEASE)

    # dK = softmax_scale · dSᵀ Q: the scale of the score's derivative, applied once here.
    k_start = work.k_start
    _store_rows(grads.dk_ptr, dk * work.softmax_scale, k_start + first_key, k_start + seqlen_k,
                work.batch, work.kv_head, grads.stride_dkb, grads.stride_dks, grads.stride_dkh,
                grads.HEAD_DIM)
    _store_rows(grads.dv_ptr, dv, k_start + first_key, k_start + seqlen_k, work.batch,
                work.kv_head, grads.stride_dvb, grads.stride_dvs, grads.stride_dvh,
                grads.HEAD_DIM_V)


@gluon.jit
def attention_bwd_fused_sm90_kernel(
    q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, dq_desc, lse_ptr, delta_ptr, dk_ptr,
    dv_ptr,
    stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh,
    seqlen_q, seqlen_k, gqa_group_size, softmax_scale, softmax_scale_log2, zero,
    cu_seqlens_q_ptr, cu_seqlens_k_ptr, total_q, total_k, first_key_block,
    HEAD_DIM: gl.constexpr, HEAD_DIM_V: gl.constexpr, CAUSAL: gl.constexpr,
    NUM_STAGES: gl.constexpr, VARLEN: gl.constexpr, PER_THREAD_RELEASE: gl.constexpr,
    KV_REGS: gl.constexpr, ALT_DQ: gl.constexpr, DQ_STORE: gl.constexpr,
):
    """Grid (key blocks of BLOCK_N, num_kv_heads, batch); 4 warps (a compute warpgroup) plus
    the workers.
    Descriptors: q, k, v, dout, dq_accum as [batch, heads, seqlen, padded head dim] views with
    boxes [1, 1, rows, padded head dim] (BLOCK_N rows for K, V; BLOCK_M for the others); lse,
    delta [batch, num_q_heads, seqlen_q] with boxes [1, 1, BLOCK_M]. HEAD_DIM, HEAD_DIM_V: the
    real head dims (stores mask the padding). VARLEN: packed sequences (cu_seqlens_q/k int32
    [batch + 1]; total_q/k rows): every tensor is one "batch" of [total, heads, ...] rows (lse and
    delta [1, num_q_heads, total_q]), program (j, h, b) takes key block j of sequence b, and
    seqlen_q/k are the longest sequence's (the grid's reach). Program j takes key block
    j + first_key_block; DQ_STORE stores its dQ tiles instead of adding them (dense calls' first
    key block, which every other block's tiles follow in the next launch)."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    start_n = (gl.program_id(0) + first_key_block) * BLOCK_N
    kv_head = gl.program_id(1)
    batch = gl.program_id(2)
    q_start = 0
    k_start = 0
    if VARLEN:
        # Clamped to the tensors, so that inconsistent cu_seqlens never move a store outside.
        q_start = gl.minimum(gl.load(cu_seqlens_q_ptr + batch), total_q)
        seqlen_q = gl.maximum(gl.minimum(gl.load(cu_seqlens_q_ptr + batch + 1), total_q)
                              - q_start, 0)
        k_start = gl.minimum(gl.load(cu_seqlens_k_ptr + batch), total_k)
        seqlen_k = gl.maximum(gl.minimum(gl.load(cu_seqlens_k_ptr + batch + 1), total_k)
                              - k_start, 0)
        batch = 0
    # Bottom-right causal: query i sees key j <= i + shift, so the first query tile that sees
    # any of this block's keys starts at (start_n - shift) // BLOCK_M.
    shift = seqlen_k - seqlen_q
    first_m = 0
    if CAUSAL:
        first_m = gl.maximum(start_n - shift, 0) // BLOCK_M
    steps_per_head = gl.maximum(gl.cdiv(seqlen_q, BLOCK_M) - first_m, 0)
    if VARLEN:
        # Key blocks past this sequence's end take no step (their stores are masked off). No
        # early return: the partitions below must start in every program.
        steps_per_head = gl.where(start_n < seqlen_k, steps_per_head, 0)
    total = steps_per_head * gqa_group_size

    work = Work(batch, kv_head, start_n, first_m, steps_per_head, total, gqa_group_size, seqlen_q,
                seqlen_k, q_start, k_start, shift, softmax_scale, softmax_scale_log2, zero, CAUSAL,
                VARLEN, PER_THREAD_RELEASE, KV_REGS, ALT_DQ, DQ_STORE)
    rings = Rings.allocate(q_desc, k_desc, v_desc, do_desc, dq_desc, NUM_STAGES,
                           PER_THREAD_RELEASE, ALT_DQ)
    grads = Grads(dk_ptr, dv_ptr, stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs,
                  stride_dvh, HEAD_DIM, HEAD_DIM_V)
    # The first compute warpgroup is the default partition: a worker partition of 4 warps gets
    # the kernel's launch register limit and spills. Arguments are aggregates, which carry
    # their constexprs (sm90.py says why a plain tuple does not).
    gl.warp_specialize([
        (_compute_partition, (work, rings, grads, 0)),
        (_compute_partition, (work, rings, grads, 1)),
        (_loader_partition, (work, rings, Inputs(q_desc, k_desc, v_desc, do_desc, lse_desc,
                                                 delta_desc, lse_ptr, delta_ptr, total_q))),
        (_dq_partition, (work, rings, dq_desc)),
    ], [4, 1, 1], [COMPUTE_REGS, WORKER_REGS, WORKER_REGS])


def supports(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor,
             lse: torch.Tensor, packed: bool) -> bool:
    """Whether the fused kernel takes these 16-bit inputs: dense [B, S, H, D] ones that
    sm90_bwd.supports() accepts, or packed [total, H, D] ones TMA can address (lse [Hq, total]);
    a FUSED_CONFIGS row for the padded head dims, Dv padded as D (dQ's buffer is D wide); dense
    lse TMA-addressable (seqlen_q a multiple of 4; packed lse is loaded by the loader warp)."""
    if width(q, v) not in FUSED_CONFIGS or padded_head_dim(q.shape[-1]) != width(q, v):
        return False
    if not packed:
        return sm90_bwd.supports(q, k, v, dout) and tma_ready(lse, (0, 1))
    return (q.dtype in (torch.float16, torch.bfloat16) and q.shape[0] > 0 and k.shape[0] > 0
            and all(x.stride(2) == 1 and tma_ready(x, (0, 1)) for x in (q, k, v, dout)))


def first_block_stores(q, v, packed: bool, causal: bool) -> bool:
    """Whether a fused backward runs as key block 0's launch, storing dQ, then the rest's
    (FIRST_BLOCK_STORES, without a mask: block 0 then reaches every query row; packed sequences
    have no common first block)."""
    return not packed and not causal and width(q, v) in FIRST_BLOCK_STORES


def fused_sm90_launch(q, k, v, dout, lse, delta, dq_accum, dk, dv, *, causal: bool,
                      softmax_scale: float, cu_seqlens_q=None, cu_seqlens_k=None,
                      max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
                      config: tuple[int, int, int] | None = None,
                      part: str = "all") -> KernelLaunch:
    """The launch for inputs supports() accepted: dense, lse and delta [B, Hq, Sq], or packed
    (cu_seqlens_q/k int32 [B + 1], max_seqlen_q/k), lse and delta [Hq, total_q]; contiguous
    float32. dq_accum fp32 with q's shape, contiguous. config: a FUSED_CONFIGS row. part: "all"
    key blocks adding into a zeroed dq_accum; or (dense, where first_block_stores()) "first",
    key block 0 storing its dQ tiles, then "rest", the others adding to them: dq_accum need be
    zeroed only where key block 0 stores nothing (query rows that see no key)."""
    assert part == "all" or first_block_stores(q, v, cu_seqlens_q is not None, causal), part
    block_n, block_m, num_stages = config or FUSED_CONFIGS[width(q, v)]
    dim, dim_v = padded_head_dim(q.shape[-1]), padded_head_dim(v.shape[-1])
    packed = cu_seqlens_q is not None
    batch = cu_seqlens_q.shape[0] - 1 if packed else q.shape[0]
    seqlen_q, seqlen_k = (max_seqlen_q, max_seqlen_k) if packed else (q.shape[1], k.shape[1])
    lse_rows, delta_rows = lse, delta     # what the loader warp reads when packed
    if packed:     # one "batch" of rows; dk, dv keep their [total, H, D] strides
        q, k, v, dout, dq_accum = (x.unsqueeze(0) for x in (q, k, v, dout, dq_accum))
        dk_strides = (0, dk.stride(0), dk.stride(1))
        dv_strides = (0, dv.stride(0), dv.stride(1))
    else:
        dk_strides, dv_strides = dk.stride()[:3], dv.stride()[:3]
    args = dict(
        q_desc=_descriptor(q.permute(0, 2, 1, 3), [1, 1, block_m, dim]),
        k_desc=_descriptor(k.permute(0, 2, 1, 3), [1, 1, block_n, dim]),
        v_desc=_descriptor(v.permute(0, 2, 1, 3), [1, 1, block_n, dim_v]),
        do_desc=_descriptor(dout.permute(0, 2, 1, 3), [1, 1, block_m, dim_v]),
        lse_desc=None if packed else _descriptor(lse, [1, 1, block_m]),
        delta_desc=None if packed else _descriptor(delta, [1, 1, block_m]),
        dq_desc=_descriptor(dq_accum.permute(0, 2, 1, 3), [1, 1, block_m, dim]),
        lse_ptr=lse_rows, delta_ptr=delta_rows, dk_ptr=dk, dv_ptr=dv,
        stride_dkb=dk_strides[0], stride_dks=dk_strides[1], stride_dkh=dk_strides[2],
        stride_dvb=dv_strides[0], stride_dvs=dv_strides[1], stride_dvh=dv_strides[2],
        seqlen_q=seqlen_q, seqlen_k=seqlen_k, gqa_group_size=q.shape[2] // k.shape[2],
        softmax_scale=float(softmax_scale), softmax_scale_log2=float(softmax_scale) * LOG2_E,
        zero=0, cu_seqlens_q_ptr=cu_seqlens_q, cu_seqlens_k_ptr=cu_seqlens_k,
        total_q=q.shape[1], total_k=k.shape[1], first_key_block=int(part == "rest"))
    constexprs = dict(HEAD_DIM=q.shape[3], HEAD_DIM_V=v.shape[3], CAUSAL=causal,
                      NUM_STAGES=num_stages, VARLEN=packed,
                      PER_THREAD_RELEASE=(dim, causal) in PER_THREAD_RELEASE,
                      KV_REGS=(dim, causal) in KV_IN_REGISTERS,
                      ALT_DQ=(dim, causal) in ALTERNATE_DQ, DQ_STORE=part == "first")
    key_blocks = -(-seqlen_k // block_n)
    key_blocks = {"all": key_blocks, "first": min(key_blocks, 1), "rest": key_blocks - 1}[part]
    grid = (key_blocks, k.shape[2], batch)
    return KernelLaunch(attention_bwd_fused_sm90_kernel, grid, args, constexprs, 4, 1)
