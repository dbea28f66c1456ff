"""hvdtrain tune for real: Optuna studies whose trials are horovodrun jobs (np 2, Gloo) or run inside one
Horovod job; pruning, a kill -9 of the tune process and the resume after it, and best.yaml reproduced."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from support.paths import ROOT
from support.processes import horovodrun, kill_tree, show
from support.runs import records

# Small and quick: the MLP on digits, one thread per worker.
BASE = ["--model", "mlp", "--threads", "1", "--tensorboard", "false"]
ENV = {"PYTHONPATH": str(ROOT)}


def tune_command(tmp_path: Path, space: str, *args: str) -> list[str]:
    (tmp_path / "space.yaml").write_text(space)
    return [sys.executable, "-m", "hvdtrain", "tune", "--space", str(tmp_path / "space.yaml"),
            "--dir", str(tmp_path / "study"), *args, *BASE]


def run_tune(command: list[str], timeout: int = 400) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONUNBUFFERED="1", **ENV))


def trials(tmp_path: Path) -> list[dict]:
    return json.loads((tmp_path / "study" / "trials.json").read_text())


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_job_mode_search_finds_095_and_best_yaml_reproduces_it(tmp_path):
    space = "lr: {type: float, low: 0.02, high: 0.2, log: true}\nbatch_size: {type: categorical, choices: [16, 32]}\n"
    # 4 trials, 2 at a time: two rounds of parallel trials are what the search's bookkeeping needs to show.
    proc = run_tune(tune_command(tmp_path, space, "--trials", "4", "--np", "2", "--parallel", "2",
                                 "--epochs", "4"))
    assert proc.returncode == 0, show(proc)
    rows = trials(tmp_path)
    assert len(rows) == 4 and {r["state"] for r in rows} <= {"COMPLETE", "PRUNED"}, rows
    assert proc.stdout.count("tune: trial ") == 4, proc.stdout                  # a line per trial
    # Each trial ran on 2 workers, so the trainer scaled its LR by 2 (linear rule): recorded per trial.
    assert all(r["world_size"] == 2 and r["lr_scale"] == 2.0 and r["lr_scaling"] == "linear" for r in rows)
    assert all(r["lr_effective"] == pytest.approx(2 * r["params"]["lr"]) for r in rows)
    best = max((r for r in rows if r["state"] == "COMPLETE"), key=lambda r: r["value"])
    assert best["value"] >= 0.95, rows   # a threshold: what the search finds is the claim, not a mechanism's copy
    study = tmp_path / "study"
    assert (study / "history.png").stat().st_size > 0 and (study / "importance.png").stat().st_size > 0
    assert f"tune: best trial {best['number']}: val_acc {best['value']:.4f}" in proc.stdout

    again = horovodrun(2, ["-m", "hvdtrain", "--config", str(study / "best.yaml"), "--run-dir", str(tmp_path / "r"),
                           "--name", "best"], "gloo", env=ENV)
    assert again.returncode == 0, show(again)
    # The trial's own config, seed, workers and backend: the very same training, so exact, not within 0.01.
    reproduced, trial = summary(tmp_path / "r" / "best"), summary(Path(best["run_dir"]))
    assert reproduced["val_acc"] == best["value"] == trial["val_acc"], (reproduced, best)
    assert reproduced["param_digests"] == trial["param_digests"] and len(set(trial["param_digests"])) == 1


def test_inprocess_mode_every_rank_trains_the_same_trials_in_lockstep(tmp_path):
    space = "lr: {type: float, low: 0.01, high: 0.2, log: true}\nbatch_size: {type: categorical, choices: [16, 64]}\n"
    args = tune_command(tmp_path, space, "--mode", "inprocess", "--trials", "4", "--epochs", "2",
                        "--pruner-startup", "1")[1:]
    proc = horovodrun(2, args, "gloo", env=ENV, timeout=400)
    assert proc.returncode == 0, show(proc)
    rows = trials(tmp_path)
    assert len(rows) == 4 and {r["state"] for r in rows} <= {"COMPLETE", "PRUNED"}, rows
    assert all(r["world_size"] == 2 and r["mode"] == "inprocess" for r in rows)
    ranks = [[json.loads(line) for line in (tmp_path / "study" / "ranks" / f"rank-{r}.jsonl").read_text().splitlines()]
             for r in (0, 1)]
    assert ranks[0][0]["pid"] != ranks[1][0]["pid"]                            # written by two processes
    assert [t["trial"] for t in ranks[0]] == [t["trial"] for t in ranks[1]] == [r["number"] for r in rows]
    for mine, theirs, row in zip(ranks[0], ranks[1], rows, strict=True):
        assert mine["params"] == theirs["params"] == row["params"]               # what rank 0 sampled
        assert mine["verdicts"] == theirs["verdicts"]                            # stopped at the same epoch
        assert len(mine["verdicts"]) == row["epochs"]
    # rank 0 alone speaks: one line per trial, not two
    assert proc.stdout.count("tune: trial ") == 4, proc.stdout


def test_a_bad_region_is_pruned_and_its_workers_stop_before_the_last_epoch(tmp_path):
    # Random sampler, seed 11: trial 0 draws lr 0.1 (learns), trial 1 lr 0.0001 (barely moves).
    space = "lr: {type: categorical, choices: [0.1, 0.0001]}\n"
    proc = run_tune(tune_command(tmp_path, space, "--trials", "2", "--np", "2", "--sampler", "random",
                                 "--sampler-seed", "11", "--pruner-startup", "1", "--epochs", "6",
                                 "--batch-size", "8", "--log-interval", "5"))
    assert proc.returncode == 0, show(proc)
    rows = trials(tmp_path)
    assert [r["params"]["lr"] for r in rows] == [0.1, 0.0001], "the sampler drew another order; pick a seed"
    good, bad = rows
    assert good["state"] == "COMPLETE" and bad["state"] == "PRUNED", rows
    epochs = records(Path(bad["run_dir"]), "epoch")
    assert len(epochs) < 6 and bad["pruned_at_epoch"] < 5, epochs               # stopped early
    assert len(epochs) <= bad["pruned_at_epoch"] + 2                             # within one epoch of the verdict
    # Every worker stopped on the tune process's SIGTERM, at a step they agreed on. Asserted on what is
    # always written: horovodrun ends the job at the first worker's exit and tears the other down, so its
    # per-process "exit with status code" lines may be missing (or name the teardown's code) and are not read.
    assert bad["exit_code"] == 1, bad                      # the job: horovodrun's status for a worker's non-zero exit
    log = Path(bad["log"]).read_text()
    first = re.search(r"The first process to do so was:\s*Process name: (\d+)\s*Exit code: (\d+)", log)
    assert first and first[2] == "143", log                # 128 + SIGTERM: hvdtrain's exit for a stop by SIGTERM
    stops = dict(re.findall(r"\[(\d)\]<stderr>:hvdtrain: stopped by (\S+ at step \d+)", log))
    assert first[1] in stops, log                          # the first to exit said why, before exiting
    assert len(set(stops.values())) == 1, log              # every rank that got to say it: the same signal and step
    signame, step = re.fullmatch(r"(SIG[A-Z]+) at step (\d+)", stops[first[1]]).groups()
    assert signame == "SIGTERM" and int(step) % 5 == 0, log    # decided in a log interval's allreduce
    # It says so only after the stop checkpoint's allgather, which the other rank joins at that step; rank 0's
    # own record of the job ends at the same step.
    assert "checkpoint_on_stop: true" in (Path(bad["run_dir"]) / "config.yaml").read_text()
    last = records(Path(bad["run_dir"]))[-1]
    assert last["step"] == int(step), (last, log)
    assert "pruned after epoch" in proc.stdout


def test_kill_9_of_the_tune_process_then_the_same_command_resumes(tmp_path):
    space = "lr: {type: float, low: 0.03, high: 0.1, log: true}\n"
    command = tune_command(tmp_path, space, "--trials", "2", "--np", "2", "--epochs", "3", "--batch-size", "8")
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                             env=dict(os.environ, PYTHONUNBUFFERED="1", **ENV))
    runs = tmp_path / "study" / "trials"
    try:
        deadline = time.monotonic() + 300
        while not (runs / "trial-0001" / "metrics.jsonl").exists():           # trial 0 done, trial 1 training
            assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "first.log").read_text()
            time.sleep(0.05)
        os.kill(first.pid, signal.SIGKILL)                                      # the tune process only
        first.wait()
    finally:
        kill_tree(first, signal.SIGKILL)
    finished = summary(runs / "trial-0000")
    stamp = (runs / "trial-0000" / "summary.json").stat().st_mtime_ns
    # Its trial job noticed (parent-death signal) and stopped; nothing of trial 1 keeps running.
    deadline = time.monotonic() + 60
    # This test's trial only: other tests' studies may run beside it (make test TEST_WORKERS=2).
    ours = str(runs / "trial-0001.yaml")
    while any(ours in " ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])):
        assert time.monotonic() < deadline, "trial 1's job outlived the tune process"
        time.sleep(0.2)

    proc = run_tune(command)
    assert proc.returncode == 0, show(proc)
    assert "resuming study 'hvdtrain'" in proc.stdout and "1 of 2 trials finished" in proc.stdout, proc.stdout
    rows = trials(tmp_path)
    assert [r["state"] for r in rows] == ["COMPLETE", "FAIL", "COMPLETE"], rows
    assert "interrupted" in rows[1]["error"]
    assert rows[2]["retry_of"] == 1 and rows[2]["params"] == rows[1]["params"]   # the interrupted one, again
    assert (runs / "trial-0000" / "summary.json").stat().st_mtime_ns == stamp    # trial 0 was not re-run
    assert rows[0]["value"] == finished["val_acc"]
    assert proc.stdout.count("tune: trial ") == 1, proc.stdout                   # only the retry ran
