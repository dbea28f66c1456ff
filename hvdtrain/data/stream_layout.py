"""Which positions of an epoch's order each rank of a stream trains, also after a resume on another number
of workers in the middle of the epoch.

A stream gives rank r the r-th contiguous block of the epoch's order (a worker then reads row groups one
after another, never all of them), padded by wrapping around so that every rank takes the same number of
steps. After `position` samples, each of the `size` ranks has trained the first position/size of its
block. Resumed on another number of workers, the rest of the epoch is what those blocks have left, in
block order; the new workers split that sequence into blocks the same way. Each such change is one
(position, workers before) pair of the epoch's `resplits`, kept in the checkpoint, so a later resume,
on yet another number of workers, finds the same sequence again: no sample is skipped or trained twice.

A sequence is a list of [begin, end) ranges of positions in the epoch's order (all below its length).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

Ranges = list[tuple[int, int]]


def length(seq: Ranges) -> int:
    return sum(end - begin for begin, end in seq)


def take(seq: Ranges, begin: int, end: int) -> Ranges:
    """seq[begin:end] as ranges; indices past the sequence's end wrap around to its beginning (padding)."""
    total = length(seq)
    out: Ranges = []
    while begin < end and total:
        index = begin % total
        for first, stop in seq:
            if index < stop - first:
                count = min(stop - first - index, end - begin)
                out.append((first + index, first + index + count))
                begin += count
                break
            index -= stop - first
    return out


def blocks(seq: Ranges, size: int) -> list[Ranges]:
    """`seq` in `size` contiguous blocks of equal length, the last ones padded by wrapping around."""
    block = math.ceil(length(seq) / size)
    return [take(seq, rank * block, (rank + 1) * block) for rank in range(size)]


def left_after(total: int, resplits: Sequence[Sequence[int]]) -> tuple[Ranges, int]:
    """(what the epoch has left to train, the position where that began) after its `resplits`:
    (position, workers) pairs, each the point where the run of `workers` ranks stopped."""
    seq: Ranges = [(0, total)]
    since = 0
    for position, workers in resplits:
        done = (position - since) // workers                 # each rank's trained head of its block
        seq = [piece for block in blocks(seq, workers) for piece in take(block, done, length(block))]
        since = position
    return seq, since


def rank_part(total: int, resplits: Sequence[Sequence[int]], start: int, rank: int, size: int) -> Ranges:
    """The positions rank `rank` of `size` trains from global position `start` of the epoch to its end."""
    seq, since = left_after(total, resplits)
    block = blocks(seq, size)[rank]
    return take(block, (start - since) // size, length(block))
