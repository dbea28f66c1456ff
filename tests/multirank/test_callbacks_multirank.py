"""A user's callbacks and LR scheduler on 2 real workers (issue 53): the events in order on every rank with the
gradients already averaged, a stop asked by one rank stops both at the same step, and a SIGKILL then
`--resume auto` ends on the uninterrupted weights, LRs and callback state."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.processes import horovodrun, show
from support.runs import assert_same_weights

SCRIPT = "tests/ranks/callbacks_job.py"
# 500 training samples, 250 per rank: 8 steps of 32 an epoch; 3 epochs, a checkpoint every 4 steps.
JOB = ["--dataset", "synthetic", "--synthetic-samples", "625", "--val-fraction", "0.2", "--synthetic-shape", "1,8,8",
       "--model", "mlp", "--hidden", "32", "--lr", "0.2", "--lr-scaling", "linear", "--warmup-epochs", "0",
       "--batch-size", "32", "--epochs", "3", "--checkpoint-steps", "4", "--threads", "1", "--log-interval", "4"]


def events(out: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (out / f"events-{rank}.jsonl").read_text().splitlines()]


def run(out: Path, name: str, backend: str, env: dict[str, str] | None = None, extra: tuple[str, ...] = ()):
    out.mkdir(exist_ok=True)
    return horovodrun(2, [SCRIPT, str(out), *JOB, "--run-dir", str(out.parent), "--name", name, *extra], backend,
                      env=env)


@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_events_come_in_order_on_every_rank_and_one_ranks_stop_stops_both_at_the_same_step(tmp_path, backend):
    proc = run(tmp_path / "stopped", "stopped", backend, env={"CB_STOP_RANK": "1", "CB_STOP_EPOCH": "1"})
    assert proc.returncode == 0, show(proc)
    per_rank = [events(tmp_path / "stopped", rank) for rank in (0, 1)]
    for seen in per_rank:
        kinds = [e["event"] for e in seen]
        # Two epochs of 8 steps: each step is before_step then step_end; an epoch_end after each 8th.
        epoch = ["before_step", "step_end"] * 8 + ["epoch_end"]
        assert kinds == ["fit_start", *epoch, *epoch, "fit_end"], kinds
        assert [e["step"] for e in seen if e["event"] == "step_end"] == list(range(1, 17))
        assert seen[-1] == {"event": "fit_end", "step": 16, "epochs": 2}
    # Rank 1 alone asked; both stopped after epoch 1 (0-based), at step 16, and agree on every step's LR.
    assert [e for e in per_rank[0] if e["event"] != "step_end"] != [] and per_rank[0][-1] == per_rank[1][-1]
    before = [[e for e in seen if e["event"] == "before_step"] for seen in per_rank]
    # Gradients averaged before the hook: the same sums on both ranks (each rank's own batch differs).
    for a, b in zip(*before, strict=True):
        assert a["grad_sum"] == pytest.approx(b["grad_sum"], rel=1e-6) and a["lr"] == b["lr"], (a, b)
    # The OneCycleLR's LR, scaled x2 for 2 workers while the step runs; step_end reports the LR applied.
    steps = [[e for e in seen if e["event"] == "step_end"] for seen in per_rank]
    assert [e["lr"] for e in steps[0]] == [e["lr"] for e in before[0]] == [e["lr"] for e in steps[1]]
    lrs = [e["lr"] for e in steps[0]]
    assert lrs[0] < lrs[4] and max(lrs) == pytest.approx(2 * 0.2, rel=0.05), lrs   # warms up to 2 x max_lr
    summary = json.loads((tmp_path / "stopped" / "summary.json").read_text())
    assert summary["rank_steps"] == [16, 16] and summary["epochs_run"] == 2
    assert len(set(summary["param_digests"])) == 1


def test_sigkill_then_resume_auto_gives_the_uninterrupted_weights_lrs_and_callback_state(tmp_path):
    full = run(tmp_path / "full", "full", "gloo")
    assert full.returncode == 0, show(full)
    killed = run(tmp_path / "cut", "cut", "gloo", env={"CB_KILL_STEP": "11"})
    assert killed.returncode != 0, show(killed)
    assert not (tmp_path / "cut" / "model.pt").exists()
    resumed = run(tmp_path / "cut", "cut", "gloo", extra=("--resume", "auto"))
    assert resumed.returncode == 0, show(resumed)
    assert_same_weights(tmp_path / "cut", tmp_path / "full")
    # The resumed job started from the step-8 checkpoint (11 is past 8) with the callback's count as of then...
    starts = [e for e in events(tmp_path / "cut", 0) if e["event"] == "fit_start"]
    assert [(e["step"], e["steps_seen"]) for e in starts] == [(0, 0), (8, 8)], starts
    # ...and ends with the uninterrupted count, on every rank, having stepped the scheduler as that run did.
    for rank in (0, 1):
        final = json.loads((tmp_path / "cut" / f"final-{rank}.json").read_text())
        assert final == json.loads((tmp_path / "full" / f"final-{rank}.json").read_text()) == {
            "steps_seen": 24, "epochs_seen": 3}

    def lr_by_step(folder: str) -> dict[int, float]:
        return {e["step"]: e["lr"] for e in events(tmp_path / folder, 0) if e["event"] == "step_end"}

    assert lr_by_step("cut") == pytest.approx(lr_by_step("full"), rel=1e-12)
