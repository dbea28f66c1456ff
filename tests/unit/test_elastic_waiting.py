"""Tier 1: what a survivor does while the elastic world re-forms (issue 33), with stand-ins for Horovod."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hvdtrain.checkpoint import format as checkpoint
from hvdtrain.checkpoint.rng_state import RandomState
from hvdtrain.checkpoint.stateful import TrainingState
from hvdtrain.config.train_config import TrainConfig
from hvdtrain.environment.process import Process
from hvdtrain.output.run_directory import RunDirectory, RunDirSettings, Verdict
from hvdtrain.train import loop_run as elastic
from hvdtrain.train.loop_run import ElasticRun, ElasticSettings, LoopHooks
from hvdtrain.train.progress import MetricSums, Progress


class FakeLoop:
    """Writes as Checkpointer.save does, with a marker telling the survivor's file from rank 0's; resizes as the
    Trainer's hook does."""

    def __init__(self, run_path: Path) -> None:
        self.run_path = run_path
        self.resized: list[int] = []

    def save(self, state: TrainingState, step: int, gathered: list[dict[str, Any]] | None = None, *,
             replace: bool = True) -> str | None:
        writer = checkpoint.save if replace else checkpoint.save_new
        path = writer(checkpoint.checkpoint_dir(self.run_path), step,
                      {"progress": state.shared["progress"].state_dict(), "workers": len(gathered or [None])}, 3)
        return str(path) if path else None

    def state(self, p: Progress, own_loader: bool) -> TrainingState:
        self.own_loader = own_loader
        return TrainingState({"progress": p}, {"rng": RandomState(), "stats": MetricSums(p)})

    def resize(self, world: Any) -> None:
        self.resized.append(world.size)


def survivor(tmp_path: Path, step: int = 10) -> tuple[ElasticRun, FakeLoop]:
    loop = FakeLoop(tmp_path)
    run_dir = RunDirectory(RunDirSettings.of(TrainConfig(run_dir="")))
    hooks = LoopHooks(train=lambda p, end: None, begin=lambda found, p, end: None, resize=loop.resize, state=loop.state,
                      zero_stats=lambda: torch.zeros(3), check_work_left=lambda p, end: None)
    run = ElasticRun(ElasticSettings(True, 1, 45), hooks, run_dir, loop,  # type: ignore[arg-type]
                     torch.nn.Linear(1, 1), torch.optim.SGD([torch.zeros(1)], lr=0.1))
    run.state = type("State", (), {})()
    run.state.start = {"plan": Verdict(str(tmp_path))}
    run.state.progress = Progress(step=step, position=40, stats=torch.zeros(3))
    return run, loop


def test_the_last_commit_save_never_replaces_an_all_worker_checkpoint(tmp_path):
    run, loop = survivor(tmp_path)
    loop.save(loop.state(run.state.progress, True), 10, [{}] * 4)        # rank 0's, from all 4 workers
    run._save_while_waiting("why")
    saved = torch.load(tmp_path / "checkpoints" / "ckpt-000000010.pt", weights_only=True)
    assert saved["workers"] == 4


def test_the_last_commit_save_leaves_rank_0s_write_in_progress_alone_and_still_saves(tmp_path):
    """Review defect: the survivor's save swept `.ckpt-*.tmp`, deleting rank 0's half-written file. Issue 51: it
    also must not take that file as "saved": rank 0 may be the worker lost mid-write (its temp file stays)."""
    run, _ = survivor(tmp_path)
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    writing = folder / ".ckpt-000000010.pt.tmp"
    writing.write_bytes(b"rank 0 is writing this")
    assert run._save_while_waiting("why") is True
    assert writing.read_bytes() == b"rank 0 is writing this"
    assert torch.load(folder / "ckpt-000000010.pt", weights_only=True)["workers"] == 1


def test_a_claim_or_temp_file_left_by_a_lost_rank_or_a_killed_run_never_reads_as_saved(tmp_path):
    """Issue 51: a `.last-commit-STEP.claim` held by another rank made survivors answer "saved" with nothing on
    disk, and the driver ended the job believing the last commit was written."""
    run, _ = survivor(tmp_path)
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    (folder / ".last-commit-000000010.claim").write_bytes(b"")       # the old scheme's claim, never released
    (folder / ".survivor-ckpt-000000010.pt.tmp").write_bytes(b"half")   # a survivor killed mid-write
    with run._waiting_for_world():
        assert run._save_on_request() is True
    assert torch.load(folder / "ckpt-000000010.pt", weights_only=True)["progress"]["step"] == 10


def test_two_survivors_saving_at_once_leave_one_whole_file_and_both_answer_saved(tmp_path):
    import threading

    runs = [survivor(tmp_path)[0] for _ in range(2)]
    answers: list[bool] = []
    go = threading.Barrier(2)

    def save(run: ElasticRun) -> None:
        go.wait()
        answers.append(run._save_while_waiting("why"))

    threads = [threading.Thread(target=save, args=(run,)) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    folder = tmp_path / "checkpoints"
    assert answers == [True, True]
    assert [f.name for f in folder.iterdir()] == ["ckpt-000000010.pt"]    # no staged file left behind
    assert torch.load(folder / "ckpt-000000010.pt", weights_only=True)["workers"] == 1


def test_the_last_commit_is_saved_when_no_checkpoint_holds_it(tmp_path, capsys):
    run, loop = survivor(tmp_path)
    run._save_while_waiting("why")
    saved = torch.load(tmp_path / "checkpoints" / "ckpt-000000010.pt", weights_only=True)
    assert saved["workers"] == 1 and "saved the last commit (step 10)" in capsys.readouterr().err
    assert saved["progress"]["position"] == 40 and not loop.own_loader   # the committed progress, no loader RNG


@pytest.mark.parametrize("driver_watching, gives_up", [(True, False), (False, True)])
def test_workers_give_up_on_their_own_only_when_no_driver_watches_the_slots(monkeypatch, tmp_path,
                                                                            driver_watching, gives_up):
    """Review defect: workers gave up start-timeout + 30 s after a reset even with enough slots (a joining
    host still loading its data ended the job); `hvdtrain launch`'s driver ends it when below --min-np."""
    timers: list[Any] = []

    class Timer:
        def __init__(self, interval: float, function: Any, args: tuple[Any, ...] = ()) -> None:
            self.function, self.interval = function, interval
            timers.append(self)

        def start(self) -> None:
            pass

        def cancel(self) -> None:
            pass

    monkeypatch.setattr(elastic.threading, "Timer", Timer)
    if driver_watching:
        monkeypatch.setenv(elastic.WATCHED_ENV, "1")
    else:
        monkeypatch.delenv(elastic.WATCHED_ENV, raising=False)
    monkeypatch.setenv(elastic.WAIT_ENV, "30")
    run, _ = survivor(tmp_path)
    with run._waiting_for_world():
        pass
    assert any(t.function == run._give_up for t in timers) == gives_up
    assert [t.interval for t in timers if t.function == run._save_last_commit] == [10]   # min(10 s, 30 s / 2)
    monkeypatch.setenv(elastic.SAVE_AFTER_ENV, "600")   # set outright: the driver's request does it first
    with run._waiting_for_world():
        pass
    assert [t.interval for t in timers if t.function == run._save_last_commit] == [10, 600]


def test_asked_by_the_driver_a_survivor_saves_once_it_waits_for_the_world_and_only_once(tmp_path, capsys):
    """`hvdtrain launch`'s driver, ending the job below --min-np, asks each worker until it answers True."""
    run, _ = survivor(tmp_path)
    assert run._save_on_request() is False        # still in a collective: the weights are not the commit's
    assert not (tmp_path / "checkpoints").exists()
    with run._waiting_for_world():
        assert run._save_on_request() is True
        assert "the job stops below --min-np: rank 0 saved the last commit (step 10)" in capsys.readouterr().err
        assert run._save_on_request() is True     # asked again (its answer lost): no second file, no second line
        assert capsys.readouterr().err == ""
    assert [f.name for f in (tmp_path / "checkpoints").iterdir() if not f.name.startswith(".")] == [
        "ckpt-000000010.pt"]


def test_a_worker_lost_mid_epoch_is_reported_with_the_metric_sums_it_took(monkeypatch, tmp_path, capsys):
    run, loop = survivor(tmp_path)
    monkeypatch.setattr(elastic.runtime, "world", lambda: Process(0, 4, 0, 4, "horovod"))
    run._note_world()
    monkeypatch.setattr(elastic.runtime, "world", lambda: Process(0, 3, 0, 3, "horovod"))
    run._on_reset()
    err = capsys.readouterr().err
    assert loop.resized == [3]
    assert err.count("\n") == 1 and "1 worker(s) left" in err and "epoch 1" in err and "train metrics" in err
