"""Split-KV plans for paged GQA decode, in plain Python/torch (unit-tested on the CPU).

A decode step runs one program per (work item, kv head, row block): a work item is a chunk of
one sequence's keys. Where the batch alone gives every SM its programs, each sequence is one
item; where it leaves SMs idle, sequences are cut into equal chunks until it does not (split
only where it pays: every extra item costs a workspace slot written and read back by the
combine). The plan is made once per decode step, from the key counts, and used by every layer:
its runs do no host synchronisation and no allocation besides their outputs, so they can be
captured in a CUDA graph.

A plan also records what it was made for. Shapes and dtypes are compared on the host at every
run (free); the key counts live on the device, where the kernel compares them with the ones
it is given and flags a mismatch (kernels/decode.py: NaN outputs and error_flags), because
reading them on the host would synchronise. DecodePlan.check_errors reads the flags.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..arch import Arch
from ..kernels.attention import decode as decode_kernels
from ..kernels.attention.decode import ERROR_KV_LENS, ERROR_PAGE_ID, ERROR_Q_LENS, DecodeConfig
from ..kernels.split_kv_combine import COMBINE_MAX_SLOTS_PER_STEP

# The combine merges at most this many slots of a sequence in one pass.
MAX_ITEMS_PER_SEQ = COMBINE_MAX_SLOTS_PER_STEP


@dataclass
class DecodePlan:
    """Work items, workspace and the facts a paged decode run must match.

    Made by tileattn.decode_plan. Tensors live on the plan's device; the kernel writes only
    partial_out, partial_lse and error_flags.
    """
    # What the plan was made for (a run with other values raises, or is flagged on the device).
    batch: int
    num_q_heads: int
    num_kv_heads: int
    q_len: int                    # the most queries one sequence has
    page_size: int
    head_dim: int
    head_dim_v: int
    kv_dtype: torch.dtype
    window_left: int              # keys before the first query's window are not planned (-1: all)
    kv_lens_host: tuple[int, ...]
    # Decisions.
    config: DecodeConfig
    block_n: int                  # key tile; chunk boundaries are multiples of it
    page_aligned: bool            # a key tile lies inside one page
    chunk_size: int               # keys per work item before per-sequence balancing
    num_work: int
    num_slots: int
    max_slots_per_seq: int        # the most slots one sequence owns (0: none is split)
    max_kv_len: int
    # Device tensors.
    work: torch.Tensor            # int32 [num_work, 4]: (batch, kv_start, kv_end, slot); slot -1
                                  # is a sequence's only item, written straight to the output
    batch_slots: torch.Tensor     # int32 [batch + 1]: sequence b owns slots [batch_slots[b], [b+1])
    kv_lens: torch.Tensor         # int32 [batch]: the key counts the plan was made for
    cu_seqlens_q_uniform: torch.Tensor  # int32 [batch + 1]: b * q_len (runs without cu_seqlens_q)
    error_flags: torch.Tensor     # int32 [1]: OR of kernels.decode.ERROR_* bits, set by runs
    partial_out: torch.Tensor     # float32 [max(num_slots, 1), q_len * num_q_heads, head_dim_v]
    partial_lse: torch.Tensor     # float32 [max(num_slots, 1), q_len * num_q_heads]

    @property
    def device(self) -> torch.device:
        return self.work.device

    def check_errors(self) -> None:
        """Raise ValueError if a run of this plan was given inputs it was not made for (the
        sequences concerned got NaN outputs), and clear the flags. Reads a device tensor, so it
        synchronises: call it outside CUDA graph capture, e.g. after a replay in debug runs,
        or let paged_decode(validate=True) call it."""
        flags = int(self.error_flags.item())
        if flags == 0:
            return
        self.error_flags.zero_()
        problems = []
        if flags & ERROR_KV_LENS:
            problems.append("key counts (seq_lens_k / cu_seqlens_k) differ from the ones the plan "
                            "was made from; make a new plan for new lengths")
        if flags & ERROR_Q_LENS:
            problems.append(f"a sequence has more than the plan's q_len={self.q_len} queries, or "
                            "cu_seqlens_q points outside q")
        if flags & ERROR_PAGE_ID:
            problems.append("block_table holds a page id outside the cache for a used page")
        raise ValueError("a paged decode run with this plan was given inputs it was not made "
                         "for (those sequences' outputs were set to NaN): " + "; ".join(problems))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def planned_key_ranges(kv_lens: list[int], q_len: int, window_left: int,
                       block_n: int) -> list[tuple[int, int]]:
    """[start, end) of the keys some query of each sequence may see: all of them, or with a
    left window, from the first query's lower bound (bottom-right aligned, a sequence with
    fewer queries than q_len starts later, so this covers it), rounded down to a key tile."""
    ranges = []
    for length in kv_lens:
        start = 0 if window_left < 0 else max(0, length - q_len - window_left)
        ranges.append((start // block_n * block_n, length))
    return ranges


def split_chunk_size(lengths: list[int], *, programs_per_item: int, num_programs: int,
                     block_n: int, min_chunk: int,
                     max_items_per_seq: int = MAX_ITEMS_PER_SEQ) -> int:
    """Keys per work item: the smallest multiple of block_n, at least min_chunk, whose items
    (a sequence of n keys is max(1, ceil(n / chunk)) items, each taking programs_per_item
    programs) fit num_programs (the SMs times the programs an SM holds) and cut no sequence
    into more than max_items_per_seq. Where the batch fills num_programs unsplit, the longest
    sequence (nothing is split)."""
    longest = max(max(lengths), 1)

    def items(chunk: int) -> int:
        return sum(max(1, -(-n // chunk)) for n in lengths)

    low = max(-(-min_chunk // block_n), -(-longest // (max_items_per_seq * block_n)), 1)
    high = max(-(-longest // block_n), low)
    if items(high * block_n) * programs_per_item > num_programs:
        return high * block_n
    while low < high:   # items() only falls as the chunk grows: bisect in tiles
        middle = (low + high) // 2
        if items(middle * block_n) * programs_per_item <= num_programs:
            high = middle
        else:
            low = middle + 1
    return low * block_n


def split_work(ranges: list[tuple[int, int]], chunk_size: int, block_n: int
               ) -> tuple[list[tuple[int, int, int, int]], list[int]]:
    """(work items (batch, kv_start, kv_end, slot), batch_slots) cutting each range into
    max(1, ceil(len / chunk_size)) items of equal length in whole tiles (the last shorter), so
    that a sequence just over a chunk is two halves, not a chunk and a sliver. A sequence
    with no keys is one empty item (its rows output 0, lse -inf). Longest items first, so that
    the long ones start in the first wave and the short ones fill the tail."""
    pieces = []   # (items, keys per item) of each sequence
    for start, end in ranges:
        count = max(1, _cdiv(end - start, chunk_size))
        piece = _cdiv(_cdiv(end - start, count), block_n) * block_n
        pieces.append((max(1, _cdiv(end - start, piece)) if piece else 1, piece))
    batch_slots, next_slot = [0], 0
    for count, _ in pieces:
        next_slot += count if count > 1 else 0
        batch_slots.append(next_slot)
    work = []
    for b, ((start, end), (count, piece)) in enumerate(zip(ranges, pieces)):
        for index in range(count):
            item_start = start + index * piece
            item_end = end if count == 1 else min(item_start + piece, end)
            work.append((b, item_start, item_end, batch_slots[b] + index if count > 1 else -1))
    work.sort(key=lambda item: (-(item[2] - item[1]), item[0], item[1]))
    return work, batch_slots


# ---- how many programs an SM should hold --------------------------------------------------

# Warps an SM runs at once on the chips with the fewest (sm86/sm89: 48; sm80/sm90: 64).
MAX_WARPS_PER_SM = 48


def kv_buffers(config: DecodeConfig) -> int:
    """K/V tile buffers a program holds: Triton's pipeliner gives num_stages - 1."""
    return max(1, config.num_stages - 1)


def shared_bytes_estimate(config: DecodeConfig, block_m: int, block_n: int, head_dim: int,
                          head_dim_v: int, kv_itemsize: int) -> int:
    """Shared memory of one decode program, from its buffers: K and V tiles, the q tile and
    P for P @ V (within 1% of the compiled size of mma.sync builds; wgmma builds, block_m 64
    on sm90, take up to ~25% more, which programs_per_sm allows for)."""
    width, width_v = (decode_kernels.padded_head_dim(d) for d in (head_dim, head_dim_v))
    return (kv_buffers(config) * block_n * (width + width_v) * kv_itemsize
            + block_m * width * 2 + block_m * block_n * 2)


def programs_per_sm(config: DecodeConfig, arch: Arch, block_m: int, block_n: int,
                    head_dim: int, head_dim_v: int, kv_itemsize: int) -> int:
    """Programs per SM that the plan aims at: enough that their K/V tiles in flight reach
    config.inflight_kb_per_sm, no more than an SM holds (warps, and shared memory with a
    quarter to spare; 1 KB of each block is reserved)."""
    inflight = kv_buffers(config) * block_n * (head_dim + head_dim_v) * kv_itemsize
    wanted = -(-config.inflight_kb_per_sm * 1024 // inflight)
    shared = shared_bytes_estimate(config, block_m, block_n, head_dim, head_dim_v, kv_itemsize)
    fit = (arch.shared_memory_bytes + 1024) // (shared * 5 // 4 + 1024)
    return max(1, min(wanted, MAX_WARPS_PER_SM // config.num_warps, fit))


# ---- the plan -------------------------------------------------------------------------------

def make_decode_plan(kv_lens: list[int], *, num_q_heads: int, num_kv_heads: int, q_len: int,
                     page_size: int, head_dim: int, head_dim_v: int, kv_dtype: torch.dtype,
                     window_left: int, config: DecodeConfig, block_n: int, page_aligned: bool,
                     rows_per_program: int, arch: Arch, num_sms: int, device) -> DecodePlan:
    """The plan for checked arguments (tileattn.decode_plan checks them and picks the config)."""
    ranges = planned_key_ranges(kv_lens, q_len, window_left, block_n)
    row_blocks = -(-q_len * (num_q_heads // num_kv_heads) // rows_per_program)
    chunk = split_chunk_size([end - start for start, end in ranges],
                             programs_per_item=num_kv_heads * row_blocks,
                             num_programs=num_sms * programs_per_sm(
                                 config, arch, rows_per_program, block_n, head_dim,
                                 head_dim_v, kv_dtype.itemsize),
                             block_n=block_n,
                             min_chunk=config.min_chunk)
    work, batch_slots = split_work(ranges, chunk, block_n)
    batch = len(kv_lens)
    num_slots = batch_slots[-1]
    num_rows = q_len * num_q_heads
    as_int32 = dict(dtype=torch.int32, device=device)
    return DecodePlan(
        batch=batch, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, q_len=q_len,
        page_size=page_size, head_dim=head_dim, head_dim_v=head_dim_v, kv_dtype=kv_dtype,
        window_left=window_left, kv_lens_host=tuple(kv_lens), config=config, block_n=block_n,
        page_aligned=page_aligned, chunk_size=chunk, num_work=len(work), num_slots=num_slots,
        max_slots_per_seq=max(b - a for a, b in zip(batch_slots, batch_slots[1:])),
        max_kv_len=max(kv_lens),
        work=torch.tensor(work, **as_int32).reshape(-1, 4),
        batch_slots=torch.tensor(batch_slots, **as_int32),
        kv_lens=torch.tensor(kv_lens, **as_int32),
        cu_seqlens_q_uniform=torch.arange(batch + 1, **as_int32) * q_len,
        error_flags=torch.zeros(1, **as_int32),
        partial_out=torch.empty((max(num_slots, 1), num_rows, head_dim_v), dtype=torch.float32,
                                device=device),
        partial_lse=torch.empty((max(num_slots, 1), num_rows), dtype=torch.float32,
                                device=device),
    )
