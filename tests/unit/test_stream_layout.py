"""A stream's epoch resumed mid-way on other numbers of workers, as often as it likes: every position of
the epoch's order is trained, each once where no layout needed padding (data/stream_layout.py)."""
from __future__ import annotations

import pytest

from hvdtrain.data.stream_layout import length, rank_part, take
from hvdtrain.data.streaming import block


def positions(seq: list[tuple[int, int]]) -> list[int]:
    return [at for begin, end in seq for at in range(begin, end)]


def run(total: int, legs: list[tuple[int, int]]) -> list[int]:
    """Train `total` samples' epoch in legs of (workers, samples per worker; -1 = to the epoch's end), each leg
    resumed where the last stopped; the positions every rank trained, in all."""
    trained: list[int] = []
    resplits: list[tuple[int, int]] = []
    position, workers_before = 0, None
    for workers, each in legs:
        if workers_before not in (None, workers) and position:
            resplits.append((position, workers_before))
        parts = [rank_part(total, resplits, position, rank, workers) for rank in range(workers)]
        count = length(parts[0]) if each < 0 else each
        assert all(length(part) == length(parts[0]) for part in parts)     # equal steps on every rank
        trained += [at for part in parts for at in positions(take(part, 0, count))]
        position, workers_before = position + count * workers, workers
    return trained


def test_without_a_resplit_the_parts_are_the_blocks_streams_always_had():
    for total, size in [(80, 2), (81, 2), (80, 3), (13, 4)]:
        for rank in range(size):
            first, stop = block(total, rank, size)
            for skip in (0, 1, (stop - first) // 2):
                assert positions(rank_part(total, [], skip * size, rank, size)) == [
                    at % total for at in range(first + skip, stop)]


@pytest.mark.parametrize("legs", [
    [(2, 12), (1, -1)],                    # the case: 2 workers -> 1 trained 12 rows twice before
    [(1, 20), (2, -1)],
    [(2, 12), (1, 20), (2, -1)],           # 2 -> 1 -> 2
    [(4, 5), (2, 10), (1, 6), (2, -1)],
    [(2, 0), (1, -1)],                     # nothing trained yet in this epoch
])
def test_every_position_is_trained_once_across_changes_of_workers(legs):
    assert sorted(run(80, legs)) == list(range(80))


def test_with_padding_every_position_is_trained_and_only_padding_repeats():
    trained = run(81, [(2, 12), (3, 10), (2, -1)])
    assert set(trained) == set(range(81))
    # 81 rows on 2 workers pad 1; the 57 left after 2x12 and 3x10... pad to even blocks: a few, never many
    assert len(trained) - 81 <= 2 + 3
