"""The consumer side of the Hopper attention kernel (sm90.py): warpgroups that run
S = Q K^T and O += P V on wgmma over the K/V rings the loader fills (sm90_state.py), the
online softmax between them, and the consumer partition, whose epilogue is sm90_epilogue.py's.

What is here, top to bottom: one consumer warpgroup as a Gluon aggregate (the problem and its
work tiles are in sm90_tiles.py) with the turn barriers of the ping-pong consumers, the
softmax and the mask hooks' selects; the key loop's carried values and the key loop; the
consumer partition. Pointer layouts are in sm90.attention_sm90_kernel's docstring.

No `from __future__ import annotations` here: Gluon checks aggregate fields against their
annotations at compile time, so the annotations must be classes, not strings.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
from triton.language.core import _aggregate as aggregate

from ..gluon_common import Scalar, online_softmax, scalar
from .sm90_epilogue import store_tile
from .sm90_state import (P_OFFSET, ROW_SUMS_MMA, ROW_SUMS_PARTIAL, ROW_SUMS_REDUCED, Rings,
                         TileScales)
from .sm90_tiles import Problem


@aggregate
class Consumer:
    """One consumer partition: rows [HALF * ROWS, (HALF + 1) * ROWS) of every tile on ROWS // 16
    warps (ROWS = 64, one warpgroup, for ping-pong; 128, both in lockstep, otherwise), its rows
    of Q as the A operand of S = Q K^T, and the wgmma register layouts of its S, O and P."""
    problem: Problem
    rings: Rings
    q_op: gl.shared_memory_descriptor
    HALF: gl.constexpr
    PINGPONG: gl.constexpr
    ROWS: gl.constexpr
    HEAD_DIM_V: gl.constexpr     # V's head dim padded to a power of two (its tile's)
    FP8: gl.constexpr            # FP8 inputs: K-major V, P in e4m3 offset by 2^P_OFFSET
    V_KEYS_GROUPED: gl.constexpr  # V's keys in grouped order: P's columns follow
    P_DTYPE: gl.constexpr
    Q_REGS: gl.constexpr         # Q's rows read into registers once a tile (q_a_layout)
    s_layout: gl.constexpr
    o_layout: gl.constexpr
    p_layout: gl.constexpr
    q_a_layout: gl.constexpr
    row_layout: gl.constexpr
    l_layout: gl.constexpr       # ROW_SUMS_MMA's / _PARTIAL's [ROWS, 8] row sums

    @gluon.constexpr_function
    def __init__(self, problem, rings, q_op, HALF, PINGPONG, ROWS, HEAD_DIM_V, FP8,
                 V_KEYS_GROUPED, P_DTYPE, Q_REGS, s_layout, o_layout, p_layout, q_a_layout,
                 row_layout, l_layout):
        self.problem = problem
        self.rings = rings
        self.q_op = q_op
        self.HALF = gl.constexpr(HALF)
        self.PINGPONG = gl.constexpr(PINGPONG)
        self.ROWS = gl.constexpr(ROWS)
        self.HEAD_DIM_V = gl.constexpr(HEAD_DIM_V)
        self.FP8 = gl.constexpr(FP8)
        self.V_KEYS_GROUPED = gl.constexpr(V_KEYS_GROUPED)
        self.P_DTYPE = gl.constexpr(P_DTYPE)
        self.Q_REGS = gl.constexpr(Q_REGS)
        self.s_layout = gl.constexpr(s_layout)
        self.o_layout = gl.constexpr(o_layout)
        self.p_layout = gl.constexpr(p_layout)
        self.q_a_layout = gl.constexpr(q_a_layout)
        self.row_layout = gl.constexpr(row_layout)
        self.l_layout = gl.constexpr(l_layout)

    @gluon.jit
    def create(problem, rings, descales, HALF: gl.constexpr, PINGPONG: gl.constexpr,
               Q_REGS: gl.constexpr):
        """Consumer HALF (0 to BLOCK_M // 64 - 1) of the ping-pong warpgroups, or the lockstep
        one (HALF 0); Q_REGS: S = Q K^T takes Q from registers (q_operand)."""
        ROWS: gl.constexpr = 64 if PINGPONG else problem.BLOCK_M
        NUM_WARPS: gl.constexpr = ROWS // 16
        HEAD_DIM: gl.constexpr = rings.q_smem.shape[4]
        dtype: gl.constexpr = rings.q_smem.dtype
        FP8: gl.constexpr = dtype.primitive_bitwidth == 8
        # FP8 V tiles are K-major: [1, 1, head dim, BLOCK_N].
        HEAD_DIM_V: gl.constexpr = rings.v_smem.shape[3] if FP8 else rings.v_smem.shape[4]
        # FP8 P is e4m3 also for e5m2 V (a mantissa bit more; wgmma mixes FP8 operands).
        P_DTYPE: gl.constexpr = gl.float8e4nv if FP8 else dtype
        K_WIDTH: gl.constexpr = 32 // dtype.primitive_bitwidth
        INSTR_K: gl.constexpr = 256 // dtype.primitive_bitwidth
        # Warps tile the rows: each warpgroup owns 64 contiguous query rows of the tile.
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
            instr_shape=[16, problem.BLOCK_N, INSTR_K])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[NUM_WARPS, 1], instr_shape=[16, HEAD_DIM_V, INSTR_K])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout,
                                                     k_width=K_WIDTH)
        q_a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout,
                                                       k_width=K_WIDTH)
        row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
        l_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[NUM_WARPS, 1], instr_shape=[16, 8, INSTR_K])
        BOX_ROWS: gl.constexpr = rings.q_smem.shape[3]
        if BOX_ROWS == ROWS:
            q_op = rings.q_smem.index(HALF).reshape([ROWS, HEAD_DIM])
        else:
            q_op = rings.q_smem.index(0).reshape([BOX_ROWS, HEAD_DIM]).slice(HALF * ROWS, ROWS)
        return Consumer(problem, rings, q_op, HALF, PINGPONG, ROWS, HEAD_DIM_V, FP8,
                        descales.V_KEYS_GROUPED, P_DTYPE, Q_REGS, s_layout, o_layout, p_layout,
                        q_a_layout, row_layout, l_layout)

    @gluon.jit
    def q_operand(self):
        """The A operand of S = Q K^T for the tile whose Q is ready: Q's shared-memory rows, or
        with Q_REGS those rows read into registers, after which Q's buffer is released (the
        loader may fetch the next tile's Q under this tile's whole key loop)."""
        if self.Q_REGS:
            q = self.q_op.load(self.q_a_layout)
            mbarrier.arrive(self.rings.q_empty, count=1)
        else:
            q = self.q_op
        return q

    @gluon.jit
    def wait_turn(self, turn_count):
        """Ping-pong: warpgroup HALF issues its n-th GEMMs after the one before it in the ring
        has issued its (n-1)-th (HALF 0, whose first turn is free) or n-th, so one's softmax
        runs under the others' GEMMs."""
        if self.PINGPONG:
            FIRST: gl.constexpr = 1 if self.HALF == 0 else 0
            mbarrier.wait(self.rings.turn_bars.index(self.HALF), (turn_count & 1) ^ FIRST)
        return turn_count + 1

    @gluon.jit
    def pass_turn(self):
        if self.PINGPONG:
            NUM_CONSUMERS: gl.constexpr = self.problem.BLOCK_M // self.ROWS
            self.rings.release(self.rings.turn_bars.index((self.HALF + 1) % NUM_CONSUMERS))

    @gluon.jit
    def p_operand(self, p_f32):
        """P as the register A operand of P @ V. With V in grouped key order its columns are
        reordered alike, which makes the FP8 layout conversion a register renaming."""
        p = p_f32.to(self.P_DTYPE)
        if self.V_KEYS_GROUPED:
            BLOCK_N: gl.constexpr = self.problem.BLOCK_N
            # key 32g + 16a + 8j + 2q + b moves to 32g + 16a + 4q + 2j + b
            p = p.reshape([self.ROWS, BLOCK_N // 32, 2, 2, 4, 2]).permute((0, 1, 2, 4, 3, 5))
            p = p.reshape([self.ROWS, BLOCK_N])
        return gl.convert_layout(p, self.p_layout)

    @gluon.jit
    def carried_p(self, p_f32):
        """What the key loop carries of a block's P into the step that issues its P V
        (pv_operand): FP8's fp32 P (a loop-carried 8-bit tensor is one register a byte, unpacked
        and repacked every step), or 16-bit P packed in pairs as int32 (a loop-carried 16-bit
        tensor costs a half-swapping PRMT a register every step; docs/design.md, "FP8 and V
        layout")."""
        p = p_f32
        if not self.FP8:
            # Adjacent key columns share a thread in the accumulator layout.
            lo, hi = p_f32.reshape([self.ROWS, self.problem.BLOCK_N // 2, 2]).split()
            pack: gl.constexpr = ("cvt.rn.bf16x2.f32 $0, $2, $1;" if self.P_DTYPE == gl.bfloat16
                                  else "cvt.rn.f16x2.f32 $0, $2, $1;")
            p = gl.inline_asm_elementwise(pack, "=r,f,f", [lo, hi], dtype=gl.int32,
                                          is_pure=True, pack=1)
        return p

    @gluon.jit
    def pv_operand(self, p):
        """The A operand of P V from what the key loop carried (carried_p)."""
        if self.FP8:
            op = self.p_operand(p)
        else:
            # The dtype pair is spelled out: a tuple of constexprs does not lower (Triton 3.6).
            if self.P_DTYPE == gl.bfloat16:
                lo, hi = gl.inline_asm_elementwise("mov.b32 {$0, $1}, $2;", "=h,=h,r", [p],
                                                   dtype=(gl.bfloat16, gl.bfloat16),
                                                   is_pure=True, pack=1)
            else:
                lo, hi = gl.inline_asm_elementwise("mov.b32 {$0, $1}, $2;", "=h,=h,r", [p],
                                                   dtype=(gl.float16, gl.float16),
                                                   is_pure=True, pack=1)
            op = gl.convert_layout(gl.join(lo, hi).reshape([self.ROWS, self.problem.BLOCK_N]),
                                   self.p_layout)
        return op

    @gluon.jit
    def issue_pv(self, p_op, stage, acc, l_i):
        """O += P V on the tile in `stage`, and with ROW_SUMS_MMA l += P 1 (the row sums on the
        tensor cores, no FADD a score): returns (acc, l_i), async."""
        acc = warpgroup_mma(p_op, self.rings.v_operand(stage), acc, is_async=True)
        if self.rings.ROW_SUMS == ROW_SUMS_MMA:
            l_i = warpgroup_mma(p_op, self.rings.ones_operand(), l_i, is_async=True)
        return acc, l_i

    @gluon.jit
    def retire_pv(self, acc, l_i):
        """Wait for issue_pv's GEMMs (and every earlier one)."""
        if self.rings.ROW_SUMS == ROW_SUMS_MMA:
            acc, l_i = warpgroup_mma_wait(0, deps=(acc, l_i))
        else:
            acc = warpgroup_mma_wait(0, deps=(acc,))
        return acc, l_i

    @gluon.jit
    def rescale(self, acc, l_i, alpha):
        """O (and the [ROWS, 8] row sums) times the block's alpha."""
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, self.o_layout)), 1)
        if self.rings.ROW_SUMS != ROW_SUMS_REDUCED:
            l_i = l_i * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, self.l_layout)),
                                       1)
        return acc, l_i

    @gluon.jit
    def row_sums(self, l_i):
        """The row vector of P's sums: l_i; ROW_SUMS_MMA's column 0 of every row (each column
        holds the sum); ROW_SUMS_PARTIAL's sum over the quad's 8 partial sums."""
        if self.rings.ROW_SUMS == ROW_SUMS_MMA:
            l_i = gl.convert_layout(gl.max(l_i, 1), self.row_layout)
        elif self.rings.ROW_SUMS == ROW_SUMS_PARTIAL:
            l_i = gl.convert_layout(gl.sum(l_i, 1), self.row_layout)
        return l_i

    @gluon.jit
    def add_partial_sums(self, l_i, p_f32):
        """ROW_SUMS_PARTIAL: each thread's own columns of P added into the [ROWS, 8] sums (the
        quad's reduction once a tile, in row_sums)."""
        if self.rings.ROW_SUMS == ROW_SUMS_PARTIAL:
            part = gl.sum(gl.reshape(p_f32, [self.ROWS, self.problem.BLOCK_N // 8, 8]), 1)
            l_i = l_i + gl.convert_layout(part, self.l_layout)
        return l_i

    @gluon.jit
    def zero_sums(self):
        """A tile's first row sums: [ROWS], or the [ROWS, 8] sums of ROW_SUMS_MMA / _PARTIAL."""
        if self.rings.ROW_SUMS != ROW_SUMS_REDUCED:
            l_i = gl.zeros([self.ROWS, 8], gl.float32, layout=self.l_layout)
        else:
            l_i = gl.zeros([self.ROWS], gl.float32, layout=self.row_layout)
        return l_i

    @gluon.jit
    def mask_verdict(self, rows, tile, key_start, j, mod_args):
        """MASK_MOD's verdict on the block of keys [key_start, key_start + BLOCK_N), partial
        step j of the tile, computed before its scores are waited for, so that the hook's loads
        overlap the wgmma. With MASK_BITS: (words, bit), the verdict being words & bit != 0
        (kernels/mask_bits.py's layout: each thread reads the one word a row that holds its
        columns' bits, the sequence end included)."""
        problem = self.problem
        cols = gl.arange(0, problem.BLOCK_N, layout=gl.SliceLayout(0, self.s_layout))
        if problem.MASK_BITS:
            CHUNKS: gl.constexpr = problem.KV_BLOCK // problem.BLOCK_N
            entry = tile.bits_first + j // CHUNKS
            first_row = tile.m_block * problem.BLOCK_M // problem.BITS_Q_BLOCK * problem.BITS_Q_BLOCK
            row_words = (problem.mask_bits_ptr
                         + entry.to(gl.int64) * (problem.BITS_Q_BLOCK * CHUNKS * 4)
                         + (rows - first_row) * (CHUNKS * 4) + (j % CHUNKS) * 4)
            # Column 8i + 2w + j sits in the quad's thread w, as bit 2i + j of its word.
            # The peeled first step asks for a block that may be full: nothing to read there.
            words = gl.load(gl.expand_dims(row_words, 1) + gl.expand_dims((cols % 8) // 2, 0),
                            mask=j < tile.first_full, other=0)
            bit = gl.expand_dims(1 << (2 * (cols // 8) + cols % 2), 0)
            result = (words, bit)
        else:
            result = problem.MASK_MOD(tile.batch, tile.head, gl.expand_dims(rows, 1),
                                      gl.expand_dims(key_start + cols, 0),
                                      tile.seqlen_k - tile.seqlen_q, mod_args)
        return result

    @gluon.jit
    def softmax_update(self, s, m_i, l_i, rows, tile, key_start, scales, mod_args,
                       score_columns, MASKED: gl.constexpr, MASK_HOOK: gl.constexpr,
                       keep=None):
        """Online softmax of the score block of keys [key_start, key_start + BLOCK_N):
        (p, alpha, m_new, l_new). MASKED applies the sequence end, causal and the window,
        MASK_HOOK also MASK_MOD; SCORE_MOD applies to every block (with SCORE_LINEAR as
        score_columns, the tile's linear_columns, plus a term per row). scales: FP8's
        TileScales (else unused)."""
        problem = self.problem
        BLOCK_N: gl.constexpr = problem.BLOCK_N
        cols = key_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, self.s_layout))
        q_idx = gl.expand_dims(rows, 1)
        kv_idx = gl.expand_dims(cols, 0)
        # Bottom-right alignment within the tile's sequence.
        causal_shift = tile.seqlen_k - tile.seqlen_q
        qk_scale = problem.softmax_scale_log2
        tanh_in = problem.softcap_in
        if self.FP8:
            qk_descale = scales.at(key_start)
            if problem.SOFTCAP:
                tanh_in = tanh_in * qk_descale
            else:
                qk_scale = qk_scale * qk_descale
        if problem.SOFTCAP:
            # Before masking. The hardware tanh (one special-function op; relative error
            # 2^-11) rather than the portable hook's exp2 and division (kernels/mods.py,
            # which the backward recomputes P with): three such ops a score left the softmax
            # bound by that unit (docs/design.md, "Serving masks and varlen/paged prefill").
            s = gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f",
                                          [s * tanh_in], dtype=gl.float32,
                                          is_pure=True, pack=1)
        row_offset = None
        if problem.SCORE_LINEAR:
            # score + c (q - kv) + d = (score + c (key_start - kv)) + (the hook at the row and
            # key_start): a column term per tile, a row term per block (flex/linear.py). Rows
            # that see a key of the block are at or past key_start, as the built-in ALiBi's
            # linear form needs.
            s = s * qk_scale + score_columns
            qk_scale = 1.0
            row_offset = problem.SCORE_MOD(gl.zeros_like(rows).to(gl.float32), tile.batch,
                                           tile.head, rows, gl.full_like(rows, key_start),
                                           causal_shift, mod_args) * 1.4426950408889634
        elif problem.SCORE_MOD is not None:
            # Hooks see natural-log scores; the softmax then works in base 2.
            s = problem.SCORE_MOD(s * (qk_scale * 0.6931471805599453), tile.batch, tile.head,
                                  q_idx, kv_idx, causal_shift, mod_args)
            qk_scale = 1.4426950408889634
        if MASKED:
            if problem.CAUSAL:
                # The last key each row sees (a row vector): one compare a score covers the
                # sequence end and the diagonal, where two took three selects.
                last_key = gl.minimum(rows + causal_shift, tile.seqlen_k - 1)
                visible = kv_idx <= gl.expand_dims(last_key, 1)
            else:
                visible = kv_idx < tile.seqlen_k
            if problem.HAS_LEFT:
                visible = visible & (kv_idx >= q_idx + causal_shift - problem.window_left)
            # A mask hook alone takes the sequence end into its own select.
            if problem.CAUSAL or problem.HAS_LEFT or not MASK_HOOK:
                s = gl.where(visible, s, float("-inf"))
            if MASK_HOOK:
                if problem.MASK_BITS:
                    s = _bit_or_neg_inf(s, keep[0], keep[1])
                else:
                    if keep is None:
                        keep = problem.MASK_MOD(tile.batch, tile.head, q_idx, kv_idx,
                                                causal_shift, mod_args)
                    s = _keep_or_neg_inf(s, keep, kv_idx, tile.seqlen_k)
        # A score hook may return -inf too: rows must survive seeing only -inf.
        return online_softmax(s, m_i, l_i, qk_scale, MASKED or problem.SCORE_MOD is not None,
                              row_offset, P_OFFSET if self.FP8 else 0.0,
                              self.rings.ROW_SUMS == ROW_SUMS_REDUCED)

    @gluon.jit
    def linear_columns(self, tile, mod_args):
        """With SCORE_LINEAR: log2(e) (hook(0, n, j) - hook(0, n, 0)) = -c j log2(e) for the
        tile's key columns j, [1, BLOCK_N], probed from query n = BLOCK_N >= j (the built-in
        ALiBi's |q - kv| is linear there); a tile's batch and head fix c. Else 0."""
        if self.problem.SCORE_LINEAR:
            cols = gl.expand_dims(gl.arange(0, self.problem.BLOCK_N,
                                            layout=gl.SliceLayout(0, self.s_layout)), 0)
            zeros = gl.zeros_like(cols)
            query = zeros + self.problem.BLOCK_N
            score = zeros.to(gl.float32)
            at_key = self.problem.SCORE_MOD(score, tile.batch, tile.head, query, cols, 0,
                                            mod_args)
            at_first = self.problem.SCORE_MOD(score, tile.batch, tile.head, query, zeros, 0,
                                              mod_args)
            return (at_key - at_first) * 1.4426950408889634
        else:
            return 0.0


@gluon.jit
def _keep_or_neg_inf(s, keep, kv_idx, seqlen_k):
    """where(keep & (kv_idx < seqlen_k), s, -inf) for a mask hook's verdict keep, in inline PTX
    on keep as 16-bit integers: in IR, LLVM's SLP vectorizer turns the compares into 32-wide
    i1 vectors that the PTX backend packs into bit masks and unpacks again (docs/design.md,
    "FlexAttention"). The sequence end joins the same select (a second one cost a compare
    and a select a score more)."""
    keep, s = gl.broadcast(keep, s)
    kv_idx, s = gl.broadcast(kv_idx, s)
    return gl.inline_asm_elementwise(
        "{ .reg .pred p, q; setp.ne.b16 p, $2, 0; setp.lt.s32 q, $3, $4; and.pred p, p, q; "
        "selp.f32 $0, $1, 0fFF800000, p; }", "=f,f,h,r,r",
        [s, keep.to(gl.int16), kv_idx, gl.full(s.shape, seqlen_k, gl.int32, s.type.layout)],
        dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def _bit_or_neg_inf(s, words, bit):
    """where(words & bit != 0, s, -inf) for mask bits (Consumer.mask_verdict), in inline PTX
    as _keep_or_neg_inf is: an AND with a predicate out and a select a score."""
    words, s = gl.broadcast(words, s)
    bit, s = gl.broadcast(bit, s)
    return gl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b32 t; and.b32 t, $2, $3; setp.ne.b32 p, t, 0; "
        "selp.f32 $0, $1, 0fFF800000, p; }", "=f,f,r,r",
        [s, words, bit], dtype=gl.float32, is_pure=True, pack=1)


@aggregate
class KeyLoop:
    """What the key loop carries between blocks of a tile: O, the previous block's P (its P V not
    issued yet; Consumer.carried_p), the softmax statistics (l_i: Consumer.zero_sums' shape), and
    the ring and turn positions
    (kv_count counts K/V tiles consumed by this program; stage and phase are the previous
    block's)."""
    acc: gl.tensor
    p: gl.tensor
    m_i: gl.tensor
    l_i: gl.tensor
    kv_count: Scalar
    stage: Scalar
    phase: Scalar
    turn_count: Scalar

    @gluon.constexpr_function
    def __init__(self, acc, p, m_i, l_i, kv_count, stage, phase, turn_count):
        self.acc = acc
        self.p = p
        self.m_i = m_i
        self.l_i = l_i
        self.kv_count = scalar(kv_count)
        self.stage = scalar(stage)
        self.phase = scalar(phase)
        self.turn_count = scalar(turn_count)


# ---------------------------------------------------------------------------------------------
# Key loop
# ---------------------------------------------------------------------------------------------

@gluon.jit
def _key_blocks(loop, q_a, rows, tile, block_start, block_end, wg, scales, mod_args,
                score_columns, MASKED: gl.constexpr, MASK_HOOK: gl.constexpr):
    """Steps [block_start, block_end) of the tile: S_j = Q K_j^T overlaps O += P_{j-1} V_{j-1}.
    The loop carries P_{j-1}."""
    problem = wg.problem
    rings = wg.rings
    acc, p, m_i, l_i = loop.acc, loop.p, loop.m_i, loop.l_i
    kv_count, turn_count = loop.kv_count, loop.turn_count
    prev_stage, prev_phase = loop.stage, loop.phase
    s_zero = gl.zeros([wg.ROWS, problem.BLOCK_N], gl.float32, layout=wg.s_layout)
    for j in range(block_start, block_end):
        stage = kv_count % problem.NUM_STAGES
        phase = (kv_count // problem.NUM_STAGES) & 1
        key_start = problem.key_start(tile, j)
        p_op = wg.pv_operand(p)
        mbarrier.wait(rings.k_ready.index(stage), phase)
        mbarrier.wait(rings.v_ready.index(prev_stage), prev_phase)
        turn_count = wg.wait_turn(turn_count)
        s = warpgroup_mma(q_a, rings.k_operand(stage), s_zero, use_acc=False, is_async=True)
        acc, l_i = wg.issue_pv(p_op, prev_stage, acc, l_i)
        wg.pass_turn()
        # The mask hook's verdict before S is waited for: its loads overlap the wgmma.
        keep = None
        if MASK_HOOK:
            keep = wg.mask_verdict(rows, tile, key_start, j, mod_args)
        # wgmma groups retire in order: P V's left in flight means S_j is done, P V is not.
        PV_GROUPS: gl.constexpr = 2 if rings.ROW_SUMS == ROW_SUMS_MMA else 1
        s = warpgroup_mma_wait(PV_GROUPS, deps=(s,))
        rings.release(rings.k_empty.index(stage))
        p_f32, alpha, m_i, l_i = wg.softmax_update(s, m_i, l_i, rows, tile, key_start,
                                                   scales, mod_args, score_columns, MASKED,
                                                   MASK_HOOK, keep)
        acc, l_i = wg.retire_pv(acc, l_i)
        rings.release(rings.v_empty.index(prev_stage))
        acc, l_i = wg.rescale(acc, l_i, alpha)
        l_i = wg.add_partial_sums(l_i, p_f32)
        p = wg.carried_p(p_f32)
        prev_stage = stage
        prev_phase = phase
        kv_count += 1
    return KeyLoop(acc, p, m_i, l_i, kv_count, prev_stage, prev_phase, turn_count)


@gluon.jit
def _attend_tile(acc, m_i, l_i, kv_count, turn_count, q_a, rows, tile, wg, scales, mod_args,
                 score_columns):
    """The steps of one tile (at least one), the loop carrying P, S's A operand q_a
    (Consumer.q_operand); releases Q after its last S unless q_operand has. Returns (acc, m_i,
    l_i, kv_count, turn_count)."""
    problem = wg.problem
    rings = wg.rings
    # Step 0 is peeled: it has no previous P V to overlap with. Masked always (cheap, once
    # per tile) so that tiles whose first block crosses the diagonal need no branch.
    stage = kv_count % problem.NUM_STAGES
    phase = (kv_count // problem.NUM_STAGES) & 1
    first = tile.first_block
    key_start = problem.key_start(tile, first)
    mbarrier.wait(rings.k_ready.index(stage), phase)
    turn_count = wg.wait_turn(turn_count)
    s = warpgroup_mma(q_a, rings.k_operand(stage),
                      gl.zeros([wg.ROWS, problem.BLOCK_N], gl.float32, layout=wg.s_layout),
                      use_acc=False, is_async=True)
    wg.pass_turn()
    LISTED: gl.constexpr = problem.KV_BLOCK > 0
    HOOKED: gl.constexpr = LISTED and problem.MASK_MOD is not None
    keep = None
    if problem.MASK_BITS:
        keep = wg.mask_verdict(rows, tile, key_start, first, mod_args)
    s = warpgroup_mma_wait(0, deps=(s,))
    rings.release(rings.k_empty.index(stage))
    if HOOKED and first < tile.first_full:   # a partial block: MASK_MOD applies
        p_f32, alpha, m_i, l_i = wg.softmax_update(s, m_i, l_i, rows, tile, key_start,
                                                   scales, mod_args, score_columns, True,
                                                   True, keep)
    else:
        p_f32, alpha, m_i, l_i = wg.softmax_update(s, m_i, l_i, rows, tile, key_start,
                                                   scales, mod_args, score_columns, True,
                                                   False)
    l_i = wg.add_partial_sums(l_i, p_f32)
    loop = KeyLoop(acc, wg.carried_p(p_f32), m_i, l_i, kv_count + 1, stage, phase, turn_count)

    # Steps crossing the left window bound (block lists: partial blocks), those every row sees
    # in full, then those crossing the diagonal or the sequence end (without a window or
    # block lists: the last two, from step 1).
    if problem.HAS_LEFT or LISTED:
        loop = _key_blocks(loop, q_a, rows, tile, first + 1, gl.minimum(tile.first_full,
                                                                   tile.num_blocks),
                           wg, scales, mod_args, score_columns, True, HOOKED)
    unmasked_from = gl.maximum(tile.first_full, first + 1)
    loop = _key_blocks(loop, q_a, rows, tile, unmasked_from, tile.num_full, wg, scales, mod_args,
                       score_columns, False, False)
    loop = _key_blocks(loop, q_a, rows, tile, gl.maximum(tile.num_full, unmasked_from),
                       tile.num_blocks, wg, scales, mod_args, score_columns, True, False)
    # Q is free once the last S is computed: the loader may fetch the next tile's Q
    # while the last P V and the epilogue run (with Q_REGS, q_operand released it).
    if not wg.Q_REGS:
        mbarrier.arrive(rings.q_empty, count=1)

    # The last block's P V, alone.
    p_op = wg.pv_operand(loop.p)
    mbarrier.wait(rings.v_ready.index(loop.stage), loop.phase)
    turn_count = wg.wait_turn(loop.turn_count)
    acc, l_i = wg.issue_pv(p_op, loop.stage, loop.acc, loop.l_i)
    wg.pass_turn()
    acc, l_i = wg.retire_pv(acc, l_i)
    rings.release(rings.v_empty.index(loop.stage))
    return acc, loop.m_i, l_i, loop.kv_count, turn_count


@gluon.jit
def consumer_partition(problem, output, descales, rings, mod_args, HALF: gl.constexpr,
                       PINGPONG: gl.constexpr, Q_REGS: gl.constexpr):
    """Consumer HALF of the ping-pong warpgroups (PINGPONG), or the lockstep pair of
    warpgroups: every tile of this program's list, its rows of it. mod_args: the hooks'
    tuple; Q_REGS: Consumer.q_operand's."""
    wg = Consumer.create(problem, rings, descales, HALF, PINGPONG, Q_REGS)
    kv_count = 0
    tile_count = 0
    turn_count = 0
    start, end = problem.tile_range()
    for t in range(start, end):
        tile = problem.tile(t)
        if problem.runs(tile):
            rows = (tile.m_block * problem.BLOCK_M + HALF * wg.ROWS
                    + gl.arange(0, wg.ROWS, layout=wg.row_layout))
            m_i = gl.full([wg.ROWS], float("-inf"), gl.float32, layout=wg.row_layout)
            l_i = wg.zero_sums()
            acc = gl.zeros([wg.ROWS, wg.HEAD_DIM_V], gl.float32, layout=wg.o_layout)
            scales = TileScales(1.0, 1.0, None, 0, False)
            if wg.FP8:
                scales = descales.of_tile(tile)
            mbarrier.wait(rings.q_ready, tile_count & 1)
            if tile.first_block < tile.num_blocks:
                acc, m_i, l_i, kv_count, turn_count = _attend_tile(
                    acc, m_i, l_i, kv_count, turn_count, wg.q_operand(), rows, tile, wg, scales,
                    mod_args, wg.linear_columns(tile, mod_args))
            else:
                mbarrier.arrive(rings.q_empty, count=1)
            store_tile(acc, m_i, l_i, rows, tile, output, wg, scales)
            tile_count += 1
    if output.TMA_STORE:
        tma.store_wait(0)
