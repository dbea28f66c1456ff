"""Property: a run resumed at a step boundary trains, on every rank and at every step, the samples that a run
never stopped trains (issue 36, item 0).

The trainer's loop is simulated as pure functions of (rank, size): each rank's sampler from the global
position, its micro-batches, each micro-batch's loss weight (step_samples), and the position advancing by
len(batch) x size. Two runs agree when their per-step, per-rank micro-batches and weights are equal.
Once the resumed run's padding wrapped around from the resume position instead of the epoch's first
sample, so the last step differed whenever the workers did not divide the epoch (1,437 digits on 2 workers).

Also checked: drop_last, a short last batch and step, gradient accumulation, an elastic resize to another
number of workers before the kill, the loader's (epoch, index) sampler (--workers > 0), and the streams'
layouts (data/stream_layout.py for ParquetStream, data/streams.py's Stream).
"""
from __future__ import annotations

import itertools
from collections import Counter

import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torch.utils.data import TensorDataset

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.data.loader import LoadingSettings, build_loader
from hvdtrain.data.sample_seeds import EpochIndices
from hvdtrain.data.sharding import ShardSampler, step_samples
from hvdtrain.data.stream_layout import length, rank_part, take
from hvdtrain.data.streams import Stream

SEED, EPOCH = 42, 3
# One optimizer step on one rank: its micro-batches, each (samples, loss weight).
Step = list[tuple[tuple[int, ...], float]]


def sampler(n: int, rank: int, size: int, batch: int, drop_last: bool, position: int) -> ShardSampler:
    """A rank's sampler as the trainer sets it: built fresh (a restarted process), then the epoch and position."""
    s = ShardSampler(n, rank, size, seed=SEED, drop_last_batch=batch if drop_last else 0)
    s.set_epoch(EPOCH, start=position)
    return s


def steps_of(shard: list[int], batch: int, accumulate: int, shard_len: int) -> list[Step]:
    """The trainer's grouping of a shard into optimizer steps (Trainer._run_epoch), with loss weights."""
    batches = [tuple(shard[i:i + batch]) for i in range(0, len(shard), batch)]
    steps: list[Step] = []
    current: Step = []
    for micro, samples in enumerate(batches):
        current.append((samples, len(samples) / step_samples(micro, batch, accumulate, shard_len)))
        if (micro + 1) % accumulate == 0 or micro + 1 == len(batches):
            steps.append(current)
            current = []
    return steps


def segment(n: int, size: int, batch: int, accumulate: int, drop_last: bool, position: int,
            max_steps: int | None = None) -> tuple[list[list[Step]], int]:
    """Train from global `position` for at most `max_steps` steps (None: to the epoch's end) on `size` ranks.
    Returns (per step, per rank: the step's micro-batches; the position after them)."""
    per_rank = []
    for rank in range(size):
        s = sampler(n, rank, size, batch, drop_last, position)
        shard = list(s)
        assert len(shard) == len(s)
        per_rank.append(steps_of(shard, batch, accumulate, len(s))[:max_steps])
    assert len({len(steps) for steps in per_rank}) == 1, "ranks would take different numbers of steps"
    steps = [list(step) for step in zip(*per_rank, strict=True)]
    for step in steps:
        sizes = {tuple(len(samples) for samples, _ in rank_step) for rank_step in step}
        assert len(sizes) == 1, "ranks would disagree on the position"
        position += sum(next(iter(sizes))) * size       # Trainer: position += out.n * world.size
    return steps, position


def order(n: int, size: int, batch: int, drop_last: bool) -> list[int]:
    return sampler(n, 0, size, batch, drop_last, 0).order()


def stream_of(steps: list[list[Step]]) -> list[int]:
    """What all ranks trained in global position order: micro-batch by micro-batch, sample j of each rank."""
    out = []
    for step in steps:
        for micro in zip(*step, strict=True):
            out += [sample for row in zip(*(samples for samples, _ in micro), strict=True) for sample in row]
    return out


def assert_read_on(trained: list[int], epoch_order: list[int], first: int = 0) -> None:
    """The samples trained from global position `first` on are the epoch's order read on past its end:
    the padding is the epoch's first samples, wherever the run began or resumed."""
    assert trained == [epoch_order[i % len(epoch_order)] for i in range(first, first + len(trained))]


runs = dict(
    n=st.integers(1, 300), size=st.integers(1, 4), batch=st.integers(1, 9), accumulate=st.integers(1, 3),
    drop_last=st.booleans(), kill=st.integers(1, 60))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**runs)
@example(n=1437, size=2, batch=32, accumulate=1, drop_last=False, kill=10)   # the digits case of the issue
@example(n=3277, size=2, batch=32, accumulate=1, drop_last=False, kill=10)   # synthetic 4096
@example(n=3277, size=3, batch=32, accumulate=2, drop_last=False, kill=10)
def test_resumed_at_a_step_boundary_trains_what_an_uninterrupted_epoch_does(n, size, batch, accumulate,
                                                                            drop_last, kill):
    if n < size:
        return                                              # refused before training (check_fits)
    whole, end = segment(n, size, batch, accumulate, drop_last, 0)
    if not whole:
        return                                              # drop_last left nothing to train this epoch
    assert_read_on(stream_of(whole), order(n, size, batch, drop_last))
    kill = 1 + (kill - 1) % len(whole)                      # any step boundary, the last one too
    before, position = segment(n, size, batch, accumulate, drop_last, 0, max_steps=kill)
    after, resumed_end = segment(n, size, batch, accumulate, drop_last, position)
    assert before + after == whole and resumed_end == end
    for rank in range(size):                                # the multiset each rank trains, said outright
        assert Counter(s for step in after for samples, _ in step[rank] for s in samples) == \
            Counter(s for step in whole[kill:] for samples, _ in step[rank] for s in samples)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**runs, new_size=st.integers(1, 4), resize=st.integers(1, 60))
@example(n=1437, size=2, batch=32, accumulate=1, drop_last=False, kill=5, new_size=3, resize=4)
def test_after_an_elastic_resize_a_resume_trains_what_the_resized_run_does(n, size, batch, accumulate, drop_last,
                                                                         kill, new_size, resize):
    """`size` workers train `resize` steps, `new_size` take the rest of the epoch over (an elastic reset, or a
    mid-epoch resume on other workers); killed after `kill` more steps and resumed on `new_size`, the run
    trains what it would have, and the epoch's order is still read once, padded from its first samples."""
    if n < max(size, new_size):
        return
    whole, _ = segment(n, size, batch, accumulate, drop_last, 0)
    if not whole:
        return
    resize = 1 + (resize - 1) % len(whole)
    before, at = segment(n, size, batch, accumulate, drop_last, 0, max_steps=resize)
    resized, end = segment(n, new_size, batch, accumulate, drop_last, at)
    assert_read_on(stream_of(before), order(n, size, batch, drop_last))
    new_order = order(n, new_size, batch, drop_last)        # drop_last keeps a different number of samples
    assert_read_on(stream_of(resized), new_order, first=at)
    if not drop_last:                                       # every sample once, then less than a step of padding
        counts = Counter(stream_of(before) + stream_of(resized))
        assert set(counts) == set(range(n)) and sum(counts.values()) - n < (new_size if at < n else size)
    if not resized:
        return
    kill = 1 + (kill - 1) % len(resized)
    head, position = segment(n, new_size, batch, accumulate, drop_last, at, max_steps=kill)
    tail, resumed_end = segment(n, new_size, batch, accumulate, drop_last, position)
    assert head + tail == resized and resumed_end == end


def test_the_loaders_epoch_and_index_sampler_follows_the_shard():
    """--workers > 0 loads (epoch, index) pairs (data/sample_seeds.py): the same indices, this epoch's."""
    s = sampler(1437, 1, 2, 32, False, 640)
    assert list(EpochIndices(s)) == [(EPOCH, i) for i in s] and len(EpochIndices(s)) == len(s)


def test_a_loader_with_worker_processes_yields_the_resumed_shard_in_order():
    """A real DataLoader with 2 worker processes per rank: batches in the sampler's order, resumed or not."""
    n, size, batch = 37, 2, 4
    data = TensorDataset(torch.arange(n))
    config = LoadingSettings.of(TrainConfig(batch_size=batch, workers=2, persistent_workers=False, mp_context="fork"))

    def batches(rank: int, position: int) -> list[list[int]]:
        loader = build_loader(data, sampler(n, rank, size, batch, False, position), config, rank,
                              torch.device("cpu"))
        return [b[0].tolist() for b in loader]

    for rank in range(size):
        whole = batches(rank, 0)
        assert whole == [list(s) for s, _ in itertools.chain.from_iterable(
            steps_of(list(sampler(n, rank, size, batch, False, 0)), batch, 1, 19))]
        assert batches(rank, 3 * batch * size) == whole[3:]


@settings(max_examples=200, deadline=None)
@given(total=st.integers(1, 300), size=st.integers(1, 4), new_size=st.integers(1, 4), batch=st.integers(1, 9),
       resize=st.integers(0, 40), kill=st.integers(1, 40))
def test_a_parquet_streams_layout_resumes_where_it_stopped(total, size, new_size, batch, resize, kill):
    """ParquetStream (rank_part): blocks padded from the epoch's start, so a resume on the same workers
    leaves each rank its block's tail; after a re-split (resplits), a second resume on the new workers too."""
    if total < max(size, new_size):
        return

    def steps(resplits: list[tuple[int, int]], start: int, workers: int, limit: int | None = None):
        parts = [rank_part(total, resplits, start, rank, workers) for rank in range(workers)]
        assert len({length(p) for p in parts}) == 1
        count = -(-length(parts[0]) // batch) if limit is None else min(limit, -(-length(parts[0]) // batch))
        out = [[take(p, i * batch, min(length(p), (i + 1) * batch)) for p in parts] for i in range(count)]
        done = sum(length(step[0]) for step in out) * workers
        return out, start + done

    whole, _ = steps([], 0, size)
    resize = min(resize, len(whole))
    head, at = steps([], 0, size, resize)
    assert head == whole[:resize]
    tail, _ = steps([], at, size)
    assert head + tail == whole                              # resumed on the same workers
    resplits = [(at, size)] if at and new_size != size else []
    resized, _ = steps(resplits, at, new_size)
    if not resized:
        return
    kill = 1 + (kill - 1) % len(resized)
    first, position = steps(resplits, at, new_size, kill)
    rest, _ = steps(resplits, position, new_size)
    assert first + rest == resized


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 120), size=st.integers(1, 4), batch=st.integers(1, 9), kill=st.integers(1, 40))
def test_a_wrapped_library_stream_resumes_where_it_stopped(n, size, batch, kill):
    """Stream pads a short part by wrapping around that part from its own first item, never from the resume."""
    if n < size:
        return
    items = list(range(n))

    def shard(rank: int, start: int) -> list[int]:
        stream = Stream(items, samples=n, split=lambda data, r, s: data[r::s])
        stream.reshard(rank, size)
        stream.set_epoch(EPOCH, start=start)
        got = list(stream)
        assert len(got) == stream.shard_len()
        return got

    for rank in range(size):
        whole = shard(rank, 0)
        done = min(kill * batch, len(whole))
        assert shard(rank, done * size) == whole[done:]
