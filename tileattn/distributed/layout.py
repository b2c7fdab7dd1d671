"""Which global sequence positions each rank holds, and which part of a K/V block each ring step
attends to. Plain Python: no communication, unit-tested exhaustively (tests/test_distributed.py).

The sequence of length S is cut into equal chunks:
  * "contiguous": W chunks, rank r holds chunk r.
  * "zigzag": 2W chunks, rank r holds chunks r and 2W-1-r, concatenated in that order. Under a
    causal mask every rank then has the same amount of work (a head chunk sees few keys, its
    tail chunk many), which is why it is the default.
A rank's local rows keep global order (chunk r precedes chunk 2W-1-r), so a causal mask over
the rank's own rows is the plain causal mask of its local tensor.

Ring step s brings rank r the K/V block of rank src = (r - s) mod W. What rows see of that
block under a causal mask (a zigzag block's two halves are its two chunks):
  contiguous  src == r: the diagonal block, causal;  src < r: all of it, unmasked;
              src > r: nothing (the step is skipped).
  zigzag      src == r: causal over the rank's two chunks (global order is kept);
              src < r: both local chunks (r and 2W-1-r) come after the block's first chunk
                (src) and before its second (2W-1-src > 2W-1-r > r): every local row sees
                the first half of the block, unmasked, and none of the second half;
              src > r: the local head chunk r precedes both chunks of the block and sees
                nothing; the local tail chunk 2W-1-r follows both (2W-1-r > 2W-1-src > src)
                and sees the whole block.
Without a causal mask every step is the whole block, unmasked.
"""

from __future__ import annotations

from dataclasses import dataclass

LAYOUTS = ("zigzag", "contiguous")


def chunks_per_rank(layout: str) -> int:
    """How many equal chunks of the sequence one rank holds."""
    return 2 if layout == "zigzag" else 1


def local_runs(layout: str, rank: int, world_size: int, seqlen: int) -> list[tuple[int, int]]:
    """The (global start, length) runs of positions that `rank` holds, in local order, for a
    global sequence of `seqlen` (a multiple of world_size * chunks_per_rank(layout))."""
    chunk = seqlen // (world_size * chunks_per_rank(layout))
    if layout == "zigzag":
        return [(rank * chunk, chunk), ((2 * world_size - 1 - rank) * chunk, chunk)]
    return [(rank * chunk, chunk)]


@dataclass(frozen=True)
class BlockTask:
    """One ring step's attention call: local query rows q_rows against rows k_rows of the K/V
    block in hand, with a (bottom-right aligned) causal mask or none."""
    q_rows: slice
    k_rows: slice
    causal: bool


def block_task(layout: str, causal: bool, rank: int, source: int, local_len: int) -> BlockTask | None:
    """What `rank`'s queries attend to in the K/V block that `source` holds (module docstring);
    None when they see none of it."""
    every_row = slice(0, local_len)
    if not causal:
        return BlockTask(every_row, every_row, causal=False)
    if source == rank:
        return BlockTask(every_row, every_row, causal=True)
    if layout == "contiguous":
        return BlockTask(every_row, every_row, causal=False) if source < rank else None
    half = local_len // 2
    if source < rank:
        return BlockTask(every_row, slice(0, half), causal=False)
    return BlockTask(slice(half, local_len), every_row, causal=False)
