"""Tier 1/2: checkpoint files, the resumable sampler, and resume on one in-process worker."""
from __future__ import annotations

import errno
import random
from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils.data.distributed import DistributedSampler

from hvdtrain.checkpoint import format as checkpoint
from hvdtrain.checkpoint.rng_state import rng_state, set_rng_state
from hvdtrain.data.sharding import ShardSampler
from hvdtrain.errors import UserError


@pytest.mark.parametrize("n, size", [(10, 1), (10, 3), (1001, 2), (7, 4)])
def test_shard_sampler_matches_distributed_sampler_from_the_start(n, size):
    for epoch in range(3):
        for rank in range(size):
            ours = ShardSampler(n, rank, size, seed=5)
            ours.set_epoch(epoch)
            theirs = DistributedSampler(range(n), num_replicas=size, rank=rank, shuffle=True, seed=5)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs) and len(ours) == len(theirs)


@pytest.mark.parametrize("old_size, new_size", [(2, 2), (3, 2), (2, 3), (1, 4)])
def test_a_mid_epoch_position_resplits_the_rest_with_no_sample_lost_or_repeated(old_size, new_size):
    n, batch, steps_done = 1200, 10, 7
    before = [ShardSampler(n, r, old_size, seed=1) for r in range(old_size)]
    done = [i for s in before for i in list(s)[:steps_done * batch]]
    position = steps_done * batch * old_size
    after = []
    for rank in range(new_size):
        sampler = ShardSampler(n, rank, new_size, seed=1)
        sampler.set_epoch(0, start=position)
        after += list(sampler)
    assert sorted(set(done) | set(after)) == list(range(n))
    repeated = Counter(done + after) - Counter(range(n))
    assert sum(repeated.values()) < new_size  # only the padding that keeps step counts equal,
    assert set(repeated) <= set(before[0].order()[:new_size])  # the epoch's first samples, as without a resplit


def test_save_is_atomic_keeps_the_newest_and_loads_weights_only(tmp_path):
    for step in (5, 10, 15, 20):
        checkpoint.save(tmp_path, step, {"model": {"w": torch.full((2,), float(step))}, "progress": {"step": step}},
                        keep=2)
    assert [p.name for p in checkpoint.candidates(tmp_path)] == ["ckpt-000000020.pt", "ckpt-000000015.pt"]
    assert not list(tmp_path.glob(".*.tmp"))
    payload = checkpoint.load(tmp_path / "ckpt-000000020.pt")
    assert payload["progress"]["step"] == 20 and torch.equal(payload["model"]["w"], torch.full((2,), 20.0))


def test_a_truncated_newest_checkpoint_is_skipped_with_a_note(tmp_path):
    for step in (1, 2):
        checkpoint.save(tmp_path, step, {"progress": {"step": step}}, keep=5)
    newest = tmp_path / "ckpt-000000002.pt"
    newest.write_bytes(newest.read_bytes()[:40])
    damaged = newest.read_bytes()
    payload, path, notes = checkpoint.find_latest(tmp_path)
    assert path == tmp_path / "ckpt-000000001.pt" and payload["progress"]["step"] == 1
    assert len(notes) == 1 and "ckpt-000000002.pt is not a readable hvdtrain checkpoint" in notes[0]
    assert (tmp_path / "ckpt-000000002.pt.unreadable").read_bytes() == damaged and not newest.exists()


def test_a_whole_checkpoint_of_another_format_version_is_refused_in_one_line_and_left_alone(tmp_path):
    """Issue 36: it was renamed *.unreadable and --resume auto went back to an older one (or to step 0)."""
    checkpoint.save(tmp_path, 1, {"progress": {"step": 1}}, keep=5)
    other = tmp_path / "ckpt-000000002.pt"
    torch.save({"format": "hvdtrain-checkpoint-1", "progress": {"step": 2}}, other)
    before = other.read_bytes()
    with pytest.raises(checkpoint.CheckpointVersionError) as raised:
        checkpoint.find_latest(tmp_path)
    text = str(raised.value)
    assert "\n" not in text and "hvdtrain-checkpoint-1" in text and checkpoint.FORMAT in text, text
    assert "the hvdtrain version that wrote it" in text and "--name" in text, text
    assert other.read_bytes() == before and not list(tmp_path.glob("*" + checkpoint.UNREADABLE))
    with pytest.raises(checkpoint.CheckpointVersionError):
        checkpoint.load(other)


def _flaky_reader(monkeypatch, failures: int, error: BaseException):
    """checkpoint._read raising `error` on its first `failures` calls, then reading for real; returns the calls."""
    real, calls = checkpoint._read, []

    def read(path):
        calls.append(path.name)
        if len(calls) <= failures:
            raise error
        return real(path)

    monkeypatch.setattr(checkpoint, "_read", read)
    monkeypatch.setattr(checkpoint, "RETRY_DELAYS_S", (0.0, 0.01, 0.02))
    return calls


@pytest.mark.parametrize("error", [OSError(errno.EIO, "Input/output error"), OSError(errno.ESTALE, "Stale file handle"),
                                   MemoryError()])
def test_a_transient_read_error_is_tried_again(tmp_path, monkeypatch, error):
    for step in (1, 2):
        checkpoint.save(tmp_path, step, {"progress": {"step": step}}, keep=5)
    calls = _flaky_reader(monkeypatch, 2, error)
    payload, path, notes = checkpoint.find_latest(tmp_path)
    assert path.name == "ckpt-000000002.pt" and payload["progress"]["step"] == 2 and notes == []
    assert calls == ["ckpt-000000002.pt"] * 3


@pytest.mark.parametrize("error", [OSError(errno.EIO, "Input/output error"), MemoryError(),
                                   OSError(errno.EACCES, "Permission denied")])
def test_a_read_error_that_stays_is_reported_never_no_checkpoint(tmp_path, monkeypatch, error):
    for step in (1, 2):
        checkpoint.save(tmp_path, step, {"progress": {"step": step}}, keep=5)
    newest = tmp_path / "ckpt-000000002.pt"
    before = newest.read_bytes()
    calls = _flaky_reader(monkeypatch, 99, error)
    with pytest.raises(checkpoint.CheckpointReadError) as raised:
        checkpoint.find_latest(tmp_path)
    text = str(raised.value)
    assert "\n" not in text and "cannot read checkpoint" in text and "ckpt-000000002.pt" in text, text
    assert type(error).__name__ in text and "left as it is" in text, text
    # EIO and MemoryError: 1 + 3 retries; EACCES is no passing fault: reported at once.
    assert len(calls) == (1 if isinstance(error, OSError) and error.errno == errno.EACCES else 4)
    assert newest.read_bytes() == before and not list(tmp_path.glob("*" + checkpoint.UNREADABLE))


def test_a_storage_error_inside_torch_load_is_a_read_error_not_a_corrupt_file(tmp_path, monkeypatch):
    """torch.load reads through its C++ zip reader: an EIO from the file must still come out as EIO."""
    checkpoint.save(tmp_path, 1, {"model": {"w": torch.zeros(100_000)}}, keep=5)

    class FailingDisk(checkpoint._WatchedFile):
        def readinto(self, buffer):
            if self.tell() > 4096:      # the storage fails partway into the file
                self.error = OSError(errno.EIO, "Input/output error")
                raise self.error
            return super().readinto(buffer)

    monkeypatch.setattr(checkpoint, "_WatchedFile", FailingDisk)
    monkeypatch.setattr(checkpoint, "RETRY_DELAYS_S", (0.0,))
    with pytest.raises(checkpoint.CheckpointReadError, match="in 2 tries .OSError: .Errno 5. Input/output error"):
        checkpoint.find_latest(tmp_path)
    assert (tmp_path / "ckpt-000000001.pt").exists()


def test_a_checkpoint_cannot_run_code(tmp_path):
    class Sneaky:
        def __reduce__(self):
            return (print, ("this must never run",))

    evil = tmp_path / "ckpt-000000001.pt"
    torch.save({"format": checkpoint.FORMAT, "x": Sneaky()}, evil)
    with pytest.raises(UserError, match="not a readable hvdtrain checkpoint"):
        checkpoint.load(evil)


def test_other_files_are_refused(tmp_path):
    plain = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(1)}, plain)
    with pytest.raises(UserError, match="is not an hvdtrain checkpoint"):
        checkpoint.load(plain)
    with pytest.raises(UserError, match="does not exist"):
        checkpoint.load(tmp_path / "missing.pt")


def test_rng_state_round_trips_through_a_weights_only_file(tmp_path):
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    checkpoint.save(tmp_path, 1, {"rng": [rng_state()]}, keep=1)
    expected = (torch.rand(3), random.random(), np.random.rand())
    set_rng_state(checkpoint.load(tmp_path / "ckpt-000000001.pt")["rng"][0])
    assert torch.equal(torch.rand(3), expected[0])
    assert random.random() == expected[1] and np.random.rand() == expected[2]


def test_in_process_resume_mid_epoch_equals_an_uninterrupted_run_and_counts_only_new_samples(tmp_path, one_worker):
    """Resume on one in-process worker. Review defect: samples/s of a resumed epoch divided the samples
    restored from the checkpoint too by the time of the new run alone."""
    import json

    from hvdtrain.config.train_config import load_config
    from hvdtrain.train.config_fit import fit

    base = dict(model="mlp", epochs=2, threads=1, run_dir=str(tmp_path), checkpoint_steps=15, keep_checkpoints=9,
                tensorboard=False)
    fit(load_config(**base, name="whole"))
    # 45 steps per epoch: step 60 is inside epoch 2, as if the run had been killed there.
    middle = tmp_path / "whole" / "checkpoints" / "ckpt-000000060.pt"
    resumed = fit(load_config(**base, name="cut", resume=str(middle)))
    whole = torch.load(tmp_path / "whole" / "model.pt", weights_only=True)
    cut = torch.load(tmp_path / "cut" / "model.pt", weights_only=True)
    for key in whole:
        torch.testing.assert_close(cut[key], whole[key], atol=1e-6, rtol=0)
    last = resumed[-1]
    assert last["epoch"] == 1 and len(resumed) == 1
    # 1438 training samples; the checkpoint at step 60 had 15 batches of 32 of this epoch behind it.
    assert last["samples_per_s"] * last["epoch_time_s"] == pytest.approx(1438 - 15 * 32)
    summary = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert summary["steps"] == 90
