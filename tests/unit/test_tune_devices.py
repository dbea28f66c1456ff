"""Issue 32 item 7: `hvdtrain tune --parallel K` gives each concurrent trial its own GPUs.

The split is a pure function of the slot, K, GPUs per trial and the visible GPU ids; the job runner is
driven here with a fake horovodrun (no GPU, no Horovod) to show which CUDA_VISIBLE_DEVICES each trial got.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.errors import ConfigError
from hvdtrain.tuning import job_runner
from hvdtrain.tuning.devices import trial_gpus, visible_gpus, workers_per_host

FOUR = ["0", "1", "2", "3"]


def test_concurrent_trials_get_disjoint_equal_slices():
    assert [trial_gpus(s, 2, 2, FOUR) for s in range(2)] == ["0,1", "2,3"]
    assert [trial_gpus(s, 4, 1, FOUR) for s in range(4)] == ["0", "1", "2", "3"]
    assert [trial_gpus(s, 2, 1, FOUR) for s in range(2)] == ["0,1", "2,3"]   # spare GPUs shared out evenly
    assert [trial_gpus(s, 3, 1, FOUR) for s in range(3)] == ["0", "1", "2"]
    assert trial_gpus(1, 2, 1, ["5", "7"]) == "7"                            # the ids the parent was given


def test_no_gpus_means_no_split():
    assert trial_gpus(0, 4, 2, []) is None


def test_too_few_gpus_for_k_trials_is_one_config_error():
    with pytest.raises(ConfigError, match=r"^--parallel 3 trials x 2 GPU\(s\) each need 6 GPUs but 4 are visible; "
                                          r"use --parallel 2 or --device cpu$"):
        trial_gpus(0, 3, 2, FOUR)
    with pytest.raises(ConfigError, match="use --device cpu$"):
        trial_gpus(0, 1, 2, ["0"])


def test_visible_ids_and_workers_per_host():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": " 2, 3 ,"}, 8) == ["2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, 8) == []
    assert visible_gpus({}, 3) == ["0", "1", "2"]
    assert workers_per_host(2, "") == 2 and workers_per_host(6, "a:2,b:4") == 4 and workers_per_host(2, "a,b") == 1


class FakeJob:
    """A horovodrun that 'trains' for a moment and leaves a summary, recording the GPUs it was given."""
    seen: list[tuple[str | None, int]] = []
    live = 0
    lock = threading.Lock()

    def __init__(self, command, env, **_):
        config = Path(command[-1])
        run = config.parent / config.stem
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"val_acc": 0.5}))
        with FakeJob.lock:
            FakeJob.live += 1
            FakeJob.seen.append((env.get("CUDA_VISIBLE_DEVICES"), FakeJob.live))
        self.pid, self.returncode, self.polls = 999_999, None, 0

    def poll(self):
        self.polls += 1
        if self.polls > 2 and self.returncode is None:
            self.returncode = 0
            FakeJob.live -= 1
        return self.returncode


@pytest.mark.parametrize("device, expected", [("auto", {"0,1", "2,3"}), ("cpu", {None})])
def test_the_job_runner_hands_each_running_trial_its_own_slice(tmp_path, monkeypatch, device, expected):
    pytest.importorskip("optuna")
    from hvdtrain.tuning.space import parse_space
    from hvdtrain.tuning.study import open_study
    from hvdtrain.tuning.tune_settings import TuneSettings

    FakeJob.seen, FakeJob.live = [], 0
    monkeypatch.setattr(job_runner.subprocess, "Popen", FakeJob)
    monkeypatch.setattr(job_runner, "POLL_S", 0.0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    settings = TuneSettings(trials=4, dir=str(tmp_path / "tune"), np=2, parallel=2, sampler="random", pruner="none")
    study = open_study(settings)
    try:
        job_runner._run_all(study, parse_space({"lr": {"type": "float", "low": 0.01, "high": 0.1}}),
                            TrainConfig(device=device), job_runner.Progress(settings, 0, enabled=False), {}, None)
    finally:
        study.close()
    assert len(FakeJob.seen) == 4 and {gpus for gpus, _ in FakeJob.seen} == expected
    assert max(live for _, live in FakeJob.seen) == 2                       # two ran at once ...
    if device == "auto":
        assert [t.user_attrs["gpus"] for t in study.optuna.trials][:2] == ["0,1", "2,3"]  # ... on different GPUs
