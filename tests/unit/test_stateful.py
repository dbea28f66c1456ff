"""Tier 1: the stateful components' own states (checkpoint/stateful.py), without Horovod or a Trainer."""
from __future__ import annotations

import math

import torch

from hvdtrain.checkpoint import rng_state
from hvdtrain.checkpoint.rng_state import RandomState
from hvdtrain.train.progress import MetricSums, Progress


def test_progress_saves_every_field_but_the_sums_and_keeps_defaults_an_older_file_lacks():
    p = Progress(epoch=2, position=12, step=9, stats=torch.ones(3), best=0.5, resplits=[(4, 2)])
    state = p.state_dict()
    assert "stats" not in state and state["resplits"] == [(4, 2)] and state["best"] == 0.5
    fresh = Progress()
    fresh.load_state_dict({key: value for key, value in state.items() if key != "branch"})
    assert (fresh.epoch, fresh.position, fresh.step, fresh.branch) == (2, 12, 9, 0)
    assert fresh.stats.numel() == 0 and math.isclose(fresh.best, 0.5)


def test_metric_sums_of_another_world_count_once_on_rank_0():
    saved = [torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([3.0, 5.0], dtype=torch.float64),
             torch.tensor([0.5, 1.0], dtype=torch.float64)]
    on_root, elsewhere = Progress(), Progress()
    MetricSums(on_root).load_resized(saved, rank=0)
    MetricSums(elsewhere).load_resized(saved, rank=1)
    assert on_root.stats.tolist() == [4.5, 8.0] and elsewhere.stats.tolist() == [0.0, 0.0]
    same_world = Progress()
    MetricSums(same_world).load_state_dict(saved[1])
    assert torch.equal(MetricSums(same_world).state_dict(), saved[1])


def test_random_state_saves_the_loader_as_marked_and_leaves_it_alone_from_another_world():
    loader = torch.Generator().manual_seed(7)
    with rng_state.rng_preserved():
        random_state = RandomState(loader)
        marked = loader.get_state()
        torch.randint(10, (5,), generator=loader)            # an epoch's iter() draws its workers' seed
        assert torch.equal(random_state.state_dict()["loader"], marked)
        random_state.mark()
        assert torch.equal(random_state.state_dict()["loader"], loader.get_state())
        moved = loader.get_state()
        RandomState(loader).load_resized([random_state.state_dict()] * 2 + [rng_state.rng_state(marked)], rank=2)
        assert torch.equal(loader.get_state(), moved)        # another world's loader streams are not this rank's
        RandomState(loader).load_state_dict(rng_state.rng_state(marked))
        assert torch.equal(loader.get_state(), marked)
    assert "loader" not in RandomState().state_dict()
