"""A Parquet stream resumed mid-epoch: exact with the same workers, refused in one line with others."""
from __future__ import annotations

import pytest

from hvdtrain.data.streaming import block, check_resume
from hvdtrain.errors import UserError


def trained(total: int, size: int, per_rank: int, skip: int = 0) -> list[int]:
    """Positions of the padded order that `size` ranks train, each skipping `skip` then taking `per_rank`."""
    out = []
    for rank in range(size):
        first, stop = block(total, rank, size)
        out += [p % total for p in range(first + skip, min(stop, first + skip + per_rank))]
    return out


@pytest.mark.parametrize("total, size", [(80, 2), (81, 2), (80, 3), (13, 4)])
def test_resuming_on_the_same_workers_trains_every_remaining_sample_once(total, size):
    length = block(total, 0, size)[1]
    for done in range(length + 1):
        check_resume(done * size, size, size)
        before = trained(total, size, done)
        after = trained(total, size, length, skip=done)     # what set_epoch(start=done*size) leaves each rank
        assert sorted(before + after) == sorted(trained(total, size, length))


def test_a_mid_epoch_resume_on_other_workers_would_repeat_samples_so_it_is_refused():
    # 2 workers trained 24 of 80 rows (12 each, from both blocks); 1 worker would skip 12 rows of block 0 only.
    before, after = trained(80, 2, 12), trained(80, 1, 80, skip=12)
    assert len(set(before) & set(after)) == 12                 # the defect the check prevents
    with pytest.raises(UserError) as err:
        check_resume(24, 2, 1)
    assert str(err.value) == ("cannot resume a stream mid-epoch (24 samples in) with 1 workers: the checkpoint was "
                              "written by 2, and its blocks are not theirs; resume with 2 workers, or from a "
                              "checkpoint at an epoch boundary")
    check_resume(0, 2, 1)  # at an epoch boundary any number of workers starts the new epoch's blocks
