"""Hopper (sm90) kernels of the attention backward in Gluon, dK/dV and dQ: TMA and wgmma with
the tile a program keeps (K and V, or Q and dO) in shared memory, so the fp32 accumulators have
the registers to themselves. The dK/dV kernel is described here; the dQ kernel's docstring
says how it differs.

The portable kernel (bwd_dkdv.py) keeps K and V in registers as wgmma's A operands; at the
tiles that keep wgmma busy (64 queries x 128 keys) that spills. Here one program owns BLOCK_N
keys of one (sequence, kv head) on BLOCK_N / 16 warps; K and V come in once by TMA; Q and dO
tiles of BLOCK_M rows stream through a ring of NUM_STAGES buffers (one ready barrier each), the
next tile's copy issued before the current tile's products. Per query tile, transposed as the
portable kernel (sᵀ = K Qᵀ, so Pᵀ and dSᵀ are A operands in registers):
    sᵀ = K Qᵀ,  dPᵀ = V dOᵀ                 (both issued at once; A and B from shared memory)
    Pᵀ = exp2(sᵀ·scale·log2 e − lse·log2 e) (causal: keys after the query's position -> 0)
    dV += Pᵀ dO                             (issued while dPᵀ finishes)
    dSᵀ = Pᵀ ∘ (dPᵀ − delta),  dK += dSᵀ Q
then dK·scale and dV are stored. Query tiles of every head of the kv head's GQA group are one
flat loop (head-major), so the ring never drains between heads. The order of every sum is
fixed: deterministic, as the portable kernel.

Scope (supports()): dense [batch, seqlen, heads, head dim] fp16/bf16 inputs TMA can address,
causal (bottom-right) or not, no window, hooks or varlen, head dims with a table row (tiles
pad to a power of two; TMA zero-fills the padding and rows past each sequence's end). Query rows
past the end read lse = +inf, so their P is 0; key rows past the end are computed, never stored.
Pointer layouts: lse, delta float32 [batch, num_q_heads, seqlen_q] contiguous (lse natural log,
-inf for a row that sees no key); dk, dv k's and v's shapes, any strides, last dim contiguous.

No `from __future__ import annotations` here (Gluon reads annotations as classes).
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from ..gluon_common import tma_ready
from ..runtime import KernelLaunch
from .configs import padded_head_dim
from .sm90 import LOG2_E, _descriptor

# dK/dV: padded head dim -> (keys a program, queries a step (wgmma's N for sᵀ and dPᵀ), Q/dO
# ring stages, warps: 64 keys a warpgroup). One warpgroup of 64 keys (two programs an SM) beat
# 128 keys on two warpgroups by 5-7% (whole backward, H100). At D=64 no row of either kernel
# beat the portable ones (docs/design.md, "Backward"), so none is listed.
DKDV_CONFIGS = {128: (64, 64, 2, 4)}
# dQ: padded head dim -> (queries a program, keys a step, K/V ring stages, warps: 64 queries a
# warpgroup); 64 queries on one warpgroup beat 128 on two, and 64-key steps 32 (H100 A/Bs).
DQ_CONFIGS = {128: (64, 64, 2, 4), 256: (64, 64, 2, 4)}


# ---- what both kernels share ------------------------------------------------------------------

@gluon.constexpr_function
def _mma_layout(num_warps, n, dtype):
    """The wgmma accumulator layout of a [rows, n] product on num_warps warps: each warpgroup
    owns 64 contiguous rows."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                     instr_shape=[16, n, 256 // dtype.primitive_bitwidth])


@gluon.constexpr_function
def _a_operand_layout(parent, dtype):
    """The register A-operand layout of a product whose accumulator has layout `parent`."""
    return gl.DotOperandLayout(operand_index=0, parent=parent,
                               k_width=32 // dtype.primitive_bitwidth)


@gluon.jit
def _allocate(desc, NUM_STAGES: gl.constexpr):
    """Shared memory for NUM_STAGES tiles of desc's box (0: one tile, no stage dim)."""
    if NUM_STAGES == 0:
        return gl.allocate_shared_memory(desc.dtype, desc.block_type.shape, desc.layout)
    else:
        return gl.allocate_shared_memory(desc.dtype, [NUM_STAGES] + desc.block_type.shape,
                                         desc.layout)


@gluon.jit
def _barriers(COUNT: gl.constexpr):
    """COUNT initialised mbarriers (one arrival each)."""
    bars = gl.allocate_shared_memory(gl.int64, [COUNT, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(COUNT):
        mbarrier.init(bars.index(i), count=1)
    return bars


@gluon.jit
def _load_pair(a_desc, b_desc, batch, head, row, bar, a_dst, b_dst):
    """TMA of the tiles at rows `row`.. of (batch, head) of two tensors, on one barrier."""
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(a_desc, [batch, head, row, 0], bar, a_dst)
    tma.async_copy_global_to_shared(b_desc, [batch, head, row, 0], bar, b_dst)


@gluon.jit
def _staying_and_streaming(stay_a, stay_b, ring_a, ring_b, batch, head, row,
                           NUM_STAGES: gl.constexpr):
    """A program's shared memory: the pair of tiles it keeps (loaded here, from rows `row`.. of
    (batch, head), on the returned stay barrier) and the ring of NUM_STAGES pairs it streams,
    one ready barrier a stage. Returns (a, b, ring a, ring b, stay barrier, ring barriers)."""
    a_smem = _allocate(stay_a, 0)
    b_smem = _allocate(stay_b, 0)
    ring_a_smem = _allocate(ring_a, NUM_STAGES)
    ring_b_smem = _allocate(ring_b, NUM_STAGES)
    stay_ready = _barriers(1)
    ready = _barriers(NUM_STAGES)
    _load_pair(stay_a, stay_b, batch, head, row, stay_ready.index(0), a_smem, b_smem)
    return a_smem, b_smem, ring_a_smem, ring_b_smem, stay_ready, ready


@gluon.jit
def lse_base2(lse):
    """lse (natural log) in base 2, +inf for a row that saw no key (lse -inf), so its P is 0."""
    return gl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)


@gluon.jit
def _row_statistics(lse_ptr, delta_ptr, row_offset, rows, seqlen_q):
    """(lse in base 2, delta) of the query rows: lse +inf for a row past the end or one that
    saw no key, so its P is 0."""
    in_range = rows < seqlen_q
    lse = gl.load(lse_ptr + row_offset + rows, mask=in_range, other=float("inf"))
    delta = gl.load(delta_ptr + row_offset + rows, mask=in_range, other=0.0)
    return lse_base2(lse), delta


@gluon.jit
def _store_rows(ptr, acc, first_row, num_rows, batch, head, stride_b, stride_s, stride_h,
                WIDTH: gl.constexpr):
    """acc as rows first_row.. of (batch, head) in ptr's dtype: rows below num_rows, the first
    WIDTH columns (the rest is the tile's padding)."""
    layout: gl.constexpr = acc.type.layout
    rows = first_row + gl.arange(0, acc.shape[0], layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, layout))
    ptrs = (ptr + batch.to(gl.int64) * stride_b + head.to(gl.int64) * stride_h
            + gl.expand_dims(rows.to(gl.int64) * stride_s, 1) + gl.expand_dims(cols, 0))
    mask = gl.expand_dims(rows < num_rows, 1) & gl.expand_dims(cols < WIDTH, 0)
    gl.store(ptrs, acc.to(ptr.dtype.element_ty), mask=mask)


# ---- dK/dV ---------------------------------------------------------------------------------------

@gluon.jit
def _load_query_step(i, steps_per_head, first_m, batch, kv_head, gqa_group_size,
                     q_desc, do_desc, q_smem, do_smem, ready, NUM_STAGES: gl.constexpr):
    """TMA of step i's Q and dO tiles (head-major over the GQA group) into stage i % NUM_STAGES."""
    stage = i % NUM_STAGES
    row = (first_m + i % steps_per_head) * q_desc.block_type.shape[2]
    _load_pair(q_desc, do_desc, batch, kv_head * gqa_group_size + i // steps_per_head, row,
               ready.index(stage), q_smem.index(stage), do_smem.index(stage))


@gluon.jit
def attention_bwd_dkdv_sm90_kernel(
    q_desc, k_desc, v_desc, do_desc, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh,
    seqlen_q, seqlen_k, num_q_heads, gqa_group_size, softmax_scale, softmax_scale_log2,
    HEAD_DIM: gl.constexpr, HEAD_DIM_V: gl.constexpr, CAUSAL: gl.constexpr,
    NUM_STAGES: gl.constexpr,
):
    """Grid (key blocks, num_kv_heads, batch). Descriptors: [batch, heads, seqlen, padded head
    dim] views with boxes [1, 1, rows, padded head dim] (BLOCK_N rows for K and V, BLOCK_M for
    Q and dO). HEAD_DIM, HEAD_DIM_V: the real head dims (stores mask the padding)."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    D: gl.constexpr = q_desc.block_type.shape[3]
    DV: gl.constexpr = v_desc.block_type.shape[3]
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = _mma_layout(gl.num_warps(), BLOCK_M, dtype)
    dk_layout: gl.constexpr = _mma_layout(gl.num_warps(), D, dtype)
    dv_layout: gl.constexpr = _mma_layout(gl.num_warps(), DV, dtype)

    start_n = gl.program_id(0) * BLOCK_N
    kv_head = gl.program_id(1)
    batch = gl.program_id(2)
    k_smem, v_smem, q_smem, do_smem, kv_ready, ready = _staying_and_streaming(
        k_desc, v_desc, q_desc, do_desc, batch, kv_head, start_n, NUM_STAGES)

    # Bottom-right causal: query i sees key j <= i + shift, so the first query tile that sees
    # any of this block's keys starts at (start_n - shift) // BLOCK_M.
    shift = seqlen_k - seqlen_q
    first_m = 0
    if CAUSAL:
        first_m = gl.maximum(start_n - shift, 0) // BLOCK_M
    steps_per_head = gl.maximum(gl.cdiv(seqlen_q, BLOCK_M) - first_m, 0)
    total = steps_per_head * gqa_group_size
    for i in gl.static_range(NUM_STAGES - 1):
        if i < total:
            _load_query_step(i, steps_per_head, first_m, batch, kv_head, gqa_group_size,
                             q_desc, do_desc, q_smem, do_smem, ready, NUM_STAGES)

    k_op = k_smem.reshape([BLOCK_N, D])
    v_op = v_smem.reshape([BLOCK_N, DV])
    keys = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
    s_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=s_layout)
    dk = gl.zeros([BLOCK_N, D], gl.float32, layout=dk_layout)
    dv = gl.zeros([BLOCK_N, DV], gl.float32, layout=dv_layout)
    mbarrier.wait(kv_ready.index(0), 0)
    for i in range(total):
        # The stage step i + NUM_STAGES - 1 reuses was last read by step i - 1, whose products
        # all finished at the end of its iteration.
        if i + NUM_STAGES - 1 < total:
            _load_query_step(i + NUM_STAGES - 1, steps_per_head, first_m, batch, kv_head,
                             gqa_group_size, q_desc, do_desc, q_smem, do_smem, ready,
                             NUM_STAGES)
        stage = i % NUM_STAGES
        head = kv_head * gqa_group_size + i // steps_per_head
        queries = (first_m + i % steps_per_head) * BLOCK_M + gl.arange(
            0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
        lse_log2, delta = _row_statistics(lse_ptr, delta_ptr,
                                          (batch * num_q_heads + head).to(gl.int64) * seqlen_q,
                                          queries, seqlen_q)

        mbarrier.wait(ready.index(stage), (i // NUM_STAGES) & 1)
        q_op = q_smem.index(stage).reshape([BLOCK_M, D])
        do_op = do_smem.index(stage).reshape([BLOCK_M, DV])
        s_t = warpgroup_mma(k_op, q_op.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        dp_t = warpgroup_mma(v_op, do_op.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s_t = warpgroup_mma_wait(1, deps=(s_t,))
        p_t = gl.exp2(s_t * softmax_scale_log2 - gl.expand_dims(lse_log2, 0))
        if CAUSAL:
            # Only tiles whose first query misses this block's last key cross the diagonal.
            if (first_m + i % steps_per_head) * BLOCK_M + shift < start_n + BLOCK_N - 1:
                visible = gl.expand_dims(keys, 1) <= gl.expand_dims(queries + shift, 0)
                p_t = gl.where(visible, p_t, 0.0)
        dv = warpgroup_mma(gl.convert_layout(p_t.to(dtype), _a_operand_layout(dv_layout, dtype)),
                           do_op, dv, is_async=True)
        # Groups retire in order: one in flight (dV) means dPᵀ is done.
        dp_t = warpgroup_mma_wait(1, deps=(dp_t,))
        ds_t = (p_t * (dp_t - gl.expand_dims(delta, 0))).to(dtype)
        dk = warpgroup_mma(gl.convert_layout(ds_t, _a_operand_layout(dk_layout, dtype)), q_op,
                           dk, is_async=True)
        dv, dk = warpgroup_mma_wait(0, deps=(dv, dk))

    # dK = softmax_scale · dSᵀ Q: the scale of the score's derivative, applied once here.
    _store_rows(dk_ptr, dk * softmax_scale, start_n, seqlen_k, batch, kv_head, stride_dkb,
                stride_dks, stride_dkh, HEAD_DIM)
    _store_rows(dv_ptr, dv, start_n, seqlen_k, batch, kv_head, stride_dvb, stride_dvs,
                stride_dvh, HEAD_DIM_V)


# ---- dQ --------------------------------------------------------------------------------------------

@gluon.jit
def attention_bwd_dq_sm90_kernel(
    q_desc, k_desc, v_desc, do_desc, lse_ptr, delta_ptr, dq_ptr,
    stride_dqb, stride_dqs, stride_dqh,
    seqlen_q, seqlen_k, num_q_heads, gqa_group_size, softmax_scale, softmax_scale_log2,
    HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr,
):
    """The deterministic dQ pass: grid (query blocks, num_q_heads, batch). A program keeps its
    BLOCK_M rows of Q and dO in shared memory and their lse and delta in registers, and walks
    the key blocks they can see in order, K and V streaming through a TMA ring:
        S = Q Kᵀ, dP = dO Vᵀ, P = exp2(S·scale·log2 e − lse·log2 e), dQ += (P ∘ (dP − delta)) K
    Keys past the sequence end are zero-filled, so they add nothing to dQ. Descriptors as
    attention_bwd_dkdv_sm90_kernel's, with boxes of BLOCK_M rows for Q, dO and BLOCK_N for K,
    V; HEAD_DIM: the real head dim (the store masks the padding)."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    D: gl.constexpr = q_desc.block_type.shape[3]
    DV: gl.constexpr = v_desc.block_type.shape[3]
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = _mma_layout(gl.num_warps(), BLOCK_N, dtype)
    dq_layout: gl.constexpr = _mma_layout(gl.num_warps(), D, dtype)

    start_m = gl.program_id(0) * BLOCK_M
    head = gl.program_id(1)
    batch = gl.program_id(2)
    kv_head = head // gqa_group_size
    q_smem, do_smem, k_smem, v_smem, q_ready, ready = _staying_and_streaming(
        q_desc, do_desc, k_desc, v_desc, batch, head, start_m, NUM_STAGES)

    # Bottom-right causal: the block's last query sees keys up to start_m + BLOCK_M - 1 + shift.
    shift = seqlen_k - seqlen_q
    end_n = seqlen_k
    if CAUSAL:
        end_n = gl.minimum(seqlen_k, gl.maximum(start_m + BLOCK_M + shift, 0))
    num_blocks = gl.cdiv(end_n, BLOCK_N)
    for j in gl.static_range(NUM_STAGES - 1):
        if j < num_blocks:
            _load_pair(k_desc, v_desc, batch, kv_head, j * BLOCK_N, ready.index(j),
                       k_smem.index(j), v_smem.index(j))

    queries = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    lse_log2, delta = _row_statistics(lse_ptr, delta_ptr,
                                      (batch * num_q_heads + head).to(gl.int64) * seqlen_q,
                                      queries, seqlen_q)
    lse_log2 = gl.expand_dims(lse_log2, 1)
    delta = gl.expand_dims(delta, 1)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    dq = gl.zeros([BLOCK_M, D], gl.float32, layout=dq_layout)
    q_op = q_smem.reshape([BLOCK_M, D])
    do_op = do_smem.reshape([BLOCK_M, DV])
    mbarrier.wait(q_ready.index(0), 0)
    for j in range(num_blocks):
        # The stage block j + NUM_STAGES - 1 reuses was last read by block j - 1, whose
        # products all finished at the end of its iteration.
        nxt = j + NUM_STAGES - 1
        if nxt < num_blocks:
            _load_pair(k_desc, v_desc, batch, kv_head, nxt * BLOCK_N,
                       ready.index(nxt % NUM_STAGES), k_smem.index(nxt % NUM_STAGES),
                       v_smem.index(nxt % NUM_STAGES))
        stage = j % NUM_STAGES
        mbarrier.wait(ready.index(stage), (j // NUM_STAGES) & 1)
        k_op = k_smem.index(stage).reshape([BLOCK_N, D])
        v_op = v_smem.index(stage).reshape([BLOCK_N, DV])
        s = warpgroup_mma(q_op, k_op.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        dp = warpgroup_mma(do_op, v_op.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s,))
        p = gl.exp2(s * softmax_scale_log2 - lse_log2)
        if CAUSAL:
            # Only blocks whose last key lies past the block's first query's position.
            if (j + 1) * BLOCK_N - 1 > start_m + shift:
                keys = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
                visible = gl.expand_dims(keys, 0) <= gl.expand_dims(queries + shift, 1)
                p = gl.where(visible, p, 0.0)
        dp = warpgroup_mma_wait(0, deps=(dp,))
        ds = gl.convert_layout((p * (dp - delta)).to(dtype), _a_operand_layout(dq_layout, dtype))
        dq = warpgroup_mma(ds, k_op, dq, is_async=True)
        dq = warpgroup_mma_wait(0, deps=(dq,))

    # dQ = softmax_scale · dS K: the scale of the score's derivative, applied once here.
    _store_rows(dq_ptr, dq * softmax_scale, start_m, seqlen_q, batch, head, stride_dqb,
                stride_dqs, stride_dqh, HEAD_DIM)


def supports(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor) -> bool:
    """Whether these dense inputs suit the kernels here (the caller rules out windows, hooks,
    block masks and varlen): 16-bit, non-empty, TMA-addressable. Each kernel runs where its
    table has a row for the padded head dim (width())."""
    if q.dtype not in (torch.float16, torch.bfloat16) or q.dim() != 4:
        return False
    if q.shape[1] == 0 or k.shape[1] == 0:
        return False
    return all(x.stride(3) == 1 and tma_ready(x, (0, 1, 2)) for x in (q, k, v, dout))


def width(q: torch.Tensor, v: torch.Tensor) -> int:
    """The padded head dim the config tables are keyed by."""
    return max(padded_head_dim(q.shape[-1]), padded_head_dim(v.shape[-1]))


def _common_args(q, k, v, dout, lse, delta, block_m: int, block_n: int,
                 softmax_scale: float, shared: dict | None) -> dict:
    """Both kernels' arguments: TMA descriptors ([batch, heads, seqlen, padded head dim] views,
    block_m rows for Q and dO, block_n for K and V), lse, delta, sizes and scales. shared:
    one backward's dict, where the second kernel finds the first's arguments when its tiles
    match (descriptors are most of a launch's host time)."""
    if shared is not None and (block_m, block_n) in shared:
        return shared[(block_m, block_n)]
    num_q_heads, head_dim = q.shape[2], q.shape[3]
    dim, dim_v = padded_head_dim(head_dim), padded_head_dim(v.shape[3])
    args = dict(
        q_desc=_descriptor(q.permute(0, 2, 1, 3), [1, 1, block_m, dim]),
        k_desc=_descriptor(k.permute(0, 2, 1, 3), [1, 1, block_n, dim]),
        v_desc=_descriptor(v.permute(0, 2, 1, 3), [1, 1, block_n, dim_v]),
        do_desc=_descriptor(dout.permute(0, 2, 1, 3), [1, 1, block_m, dim_v]),
        lse_ptr=lse, delta_ptr=delta, seqlen_q=q.shape[1], seqlen_k=k.shape[1],
        num_q_heads=num_q_heads, gqa_group_size=num_q_heads // k.shape[2],
        softmax_scale=float(softmax_scale), softmax_scale_log2=float(softmax_scale) * LOG2_E)
    if shared is not None:
        shared[(block_m, block_n)] = args
    return args


def dkdv_sm90_launch(q, k, v, dout, lse, delta, dk, dv, *, causal: bool, softmax_scale: float,
                     config: tuple[int, int, int, int] | None = None,
                     shared: dict | None = None) -> KernelLaunch:
    """The dK/dV launch for inputs supports() accepted; lse and delta [B, Hq, Sq] contiguous.
    config: a DKDV_CONFIGS-style row instead of the table's (tuning). shared: _common_args'."""
    block_n, block_m, num_stages, num_warps = config or DKDV_CONFIGS[width(q, v)]
    args = dict(_common_args(q, k, v, dout, lse, delta, block_m, block_n, softmax_scale, shared),
                dk_ptr=dk, dv_ptr=dv,
                stride_dkb=dk.stride(0), stride_dks=dk.stride(1), stride_dkh=dk.stride(2),
                stride_dvb=dv.stride(0), stride_dvs=dv.stride(1), stride_dvh=dv.stride(2))
    constexprs = dict(HEAD_DIM=q.shape[3], HEAD_DIM_V=v.shape[3], CAUSAL=causal,
                      NUM_STAGES=num_stages)
    grid = (-(-k.shape[1] // block_n), k.shape[2], q.shape[0])
    return KernelLaunch(attention_bwd_dkdv_sm90_kernel, grid, args, constexprs, num_warps, 1)


def dq_sm90_launch(q, k, v, dout, lse, delta, dq, *, causal: bool, softmax_scale: float,
                   config: tuple[int, int, int, int] | None = None,
                   shared: dict | None = None) -> KernelLaunch:
    """The dQ launch for inputs supports() accepted; lse and delta [B, Hq, Sq] contiguous.
    config: a DQ_CONFIGS-style row instead of the table's (tuning). shared: _common_args'."""
    block_m, block_n, num_stages, num_warps = config or DQ_CONFIGS[width(q, v)]
    args = dict(_common_args(q, k, v, dout, lse, delta, block_m, block_n, softmax_scale, shared),
                dq_ptr=dq, stride_dqb=dq.stride(0), stride_dqs=dq.stride(1),
                stride_dqh=dq.stride(2))
    constexprs = dict(HEAD_DIM=q.shape[3], CAUSAL=causal, NUM_STAGES=num_stages)
    grid = (-(-q.shape[1] // block_m), q.shape[2], q.shape[0])
    return KernelLaunch(attention_bwd_dq_sm90_kernel, grid, args, constexprs, num_warps, 1)
