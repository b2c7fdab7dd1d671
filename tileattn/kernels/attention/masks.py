"""What every attention kernel agrees on about which keys a query sees, and where a key lives.

Positions are bottom-right aligned per sequence: query i sits at p = i + shift with
shift = seqlen_k - seqlen_q, and sees keys j with p - window_left <= j <= p + window_right,
each bound present only where HAS_LEFT / HAS_RIGHT (causal is HAS_RIGHT with window_right = 0).
Bounds decide which key blocks a query tile visits at all, so work scales with the window; the
score and mask hooks of docs/design.md ("Mods") handle everything else.

A paged cache stores sequence b's key j in page block_table[b, j // PAGE_SIZE], row
j % PAGE_SIZE. Page ids outside [0, num_pages) are never followed: they read page 0 and the
caller turns the tile's output into NaN.
"""

import triton
import triton.language as tl


@triton.jit
def key_blocks(m0, m1, seqlen_k, shift, window_left, window_right,
               HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, BLOCK_N: tl.constexpr):
    """For the query rows [m0, m1) (m1 > m0, real rows only): (lo, full_lo, full_hi, hi), key
    offsets where [lo, full_lo) and [full_hi, hi) are the blocks that need masks and
    [full_lo, full_hi) those every row sees in full. lo, full_lo and full_hi are multiples of
    BLOCK_N; the segments are disjoint, cover every visible key, and may be empty."""
    hi = seqlen_k
    full_hi = seqlen_k
    if HAS_RIGHT:
        hi = tl.minimum(hi, m1 - 1 + shift + window_right + 1)
        full_hi = tl.minimum(full_hi, m0 + shift + window_right + 1)
    hi = tl.maximum(hi, 0)
    lo = 0
    full_lo = 0
    if HAS_LEFT:
        lo = tl.maximum(m0 + shift - window_left, 0) // BLOCK_N * BLOCK_N
        full_lo = tl.maximum(m1 - 1 + shift - window_left, 0)
    hi_blocks = tl.cdiv(hi, BLOCK_N) * BLOCK_N
    full_lo = tl.minimum(tl.maximum(tl.cdiv(full_lo, BLOCK_N) * BLOCK_N, lo), hi_blocks)
    full_hi = tl.minimum(tl.maximum(tl.maximum(full_hi, 0) // BLOCK_N * BLOCK_N, full_lo),
                         hi_blocks)
    return lo, full_lo, full_hi, hi


@triton.jit
def visible(rows, cols, seqlen_k, shift, window_left, window_right,
            HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """[rows, cols] mask of the keys each query sees (sequence end and window bounds)."""
    seen = cols[None, :] < seqlen_k
    if HAS_RIGHT:
        seen = seen & (cols[None, :] <= rows[:, None] + shift + window_right)
    if HAS_LEFT:
        seen = seen & (cols[None, :] >= rows[:, None] + shift - window_left)
    return seen


@triton.jit
def paged_rows(block_table_row, start_n, offs_n, seqlen_k, num_pages, stride_page, stride_row,
               PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """(row offsets int64 [BLOCK_N], any_bad_page) of keys start_n + offs_n in a paged cache.
    Where PAGE_SIZE is a multiple of BLOCK_N the block lies in one page: one page id a block."""
    cols = start_n + offs_n
    if PAGE_SIZE % BLOCK_N == 0:
        page = tl.load(block_table_row + start_n // PAGE_SIZE)
        bad = (page < 0) | (page >= num_pages)
        page = tl.where(bad, 0, page)
        rows = page.to(tl.int64) * stride_page + (cols % PAGE_SIZE).to(tl.int64) * stride_row
    else:
        in_range = cols < seqlen_k
        page = tl.load(block_table_row + cols // PAGE_SIZE, mask=in_range, other=0)
        outside = (page < 0) | (page >= num_pages)
        bad = tl.max(outside.to(tl.int32), 0) > 0
        page = tl.where(outside, 0, page)
        rows = page.to(tl.int64) * stride_page + (cols % PAGE_SIZE).to(tl.int64) * stride_row
    return rows, bad


@triton.jit
def step_start(position, indices_ptr, BLOCK: tl.constexpr, BLOCK_MASK: tl.constexpr):
    """Where step `position` of a key (or query) loop starts: the position itself over a
    contiguous range (BLOCK_MASK 0), else its BLOCK-wide step inside the block-mask list
    indices_ptr, whose entries are blocks of BLOCK_MASK positions (BLOCK divides BLOCK_MASK)."""
    start = position
    if BLOCK_MASK > 0:
        STEPS: tl.constexpr = BLOCK_MASK // BLOCK
        start = (tl.load(indices_ptr + position // STEPS) * BLOCK_MASK
                 + (position % STEPS) * BLOCK)
    return start


@triton.jit
def load_tile(ptrs, row_ok, col_ok, MASK_ROWS: tl.constexpr, MASK_COLS: tl.constexpr):
    """Load a 2-D tile, zero-filling rows where not row_ok and cols where not col_ok, where asked.
    Unmasked loads where the bounds are known to hold keep the steady-state loop predicate-free."""
    if MASK_ROWS and MASK_COLS:
        return tl.load(ptrs, mask=row_ok[:, None] & col_ok[None, :], other=0.0)
    elif MASK_ROWS:
        return tl.load(ptrs, mask=row_ok[:, None], other=0.0)
    elif MASK_COLS:
        return tl.load(ptrs, mask=col_ok[None, :], other=0.0)
    else:
        return tl.load(ptrs)
