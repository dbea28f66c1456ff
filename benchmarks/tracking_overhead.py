"""The step-time cost of experiment tracking (issue 27: target < 1%): the same Trainer run with `--tracking none`,
`mlflow` (embedded sqlite store) and `wandb` (offline), taking turns in ONE process.

    python -m benchmarks.tracking_overhead --model mlp --rounds 8 --out benchmarks/results/DATE-x-tracking

Every variant writes the same run folder files (metrics.jsonl, checkpoints at the end); only the tracker
differs. Tracking puts each log interval's record on a queue that a background thread sends (and samples the
host every 10 s), so the training thread's cost is one queue put per record; the thread's own work competes for
the same cores. As in benchmarks.overhead, variants alternate within each round (a 2-core VM drifts by 10-30%
between processes), each round keeps each variant's median step, and the summary is the median of those:
ratio none/tracked (1.0 = no cost) and the paired difference in microseconds per step. `--log-interval 1` is the
worst case (a record every step); the default 10 is hvdtrain's own default.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.clock import StepClock
from benchmarks.loops import bench_config, workload
from benchmarks.workloads import MODELS

WARMUP = 10


def one_round(number: int, order: list[str], args: argparse.Namespace, folder: Path) -> dict[str, dict[str, float]]:
    import hvdtrain

    medians = {}
    for variant in order:
        config = bench_config(args.model, args.steps + WARMUP + 1, 1, args.smoke, 1,
                              extra=["--run-dir", str(folder), "--name", f"r{number}-{variant}", "--tracking", variant,
                                     "--log-interval", str(args.log_interval), "--tensorboard", "false"])
        torch.manual_seed(config.seed)
        work = workload(args, config, 0, 1)
        clock = StepClock(work["model"])
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            hvdtrain.Trainer(work["model"], work["train"], None, config=config, step_fn=work["step_fn"]).fit()
        # Wall time per step, and the whole process's CPU time per step (every thread: the tracker's too), which
        # a loaded machine stretches far less than wall time.
        medians[variant] = {"ms": statistics.median(clock.step_ms(WARMUP)),
                            "cpu_ms": statistics.median(clock.cpu_ms(WARMUP))}
    return medians


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mlp", choices=sorted(MODELS))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=150, help="timed steps per run (after 10 warm-up)")
    parser.add_argument("--log-interval", type=int, default=10, help="steps between records (1: the worst case)")
    parser.add_argument("--trackers", default="mlflow,wandb", help="compared with none, comma-separated")
    parser.add_argument("--smoke", action="store_true", help="tiny model: checks the tool, not speed")
    parser.add_argument("--out", help="folder for tracking_MODEL_logN.json")
    args = parser.parse_args(argv)
    args.device = "cpu"
    from hvdtrain.distributed import horovod_settings as settings
    from hvdtrain.distributed import runtime

    variants = ["none", *[t for t in args.trackers.split(",") if t]]
    runtime.init(settings.horovod_env(bench_config(args.model, 2, 1, args.smoke, 1)))
    torch.set_num_threads(1)
    os.environ.pop("MLFLOW_TRACKING_URI", None)     # the embedded store in the scratch folder, never a server
    os.environ.setdefault("WANDB_MODE", "offline")
    rounds = []
    with tempfile.TemporaryDirectory(prefix="hvdtrain-tracking-bench-") as scratch:
        for name in ("WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR"):   # wandb's logs too: not in ~
            os.environ.setdefault(name, str(Path(scratch) / name.lower()))
        for number in range(args.rounds + 1):   # round 0 warms up (imports, the sqlite schema, wandb's service)
            order = variants[number % len(variants):] + variants[:number % len(variants)]
            medians = one_round(number, order, args, Path(scratch))
            print(f"round {number}{' (warm-up, not counted)' if number == 0 else ''}: " + "  ".join(
                f"{v} {medians[v]['ms']:.3f} ms (cpu {medians[v]['cpu_ms']:.3f})" for v in variants), flush=True)
            if number:
                rounds.append(medians)
    summary: dict[str, Any] = {"model": args.model, "steps": args.steps, "log_interval": args.log_interval,
                               "smoke": args.smoke, "rounds": rounds}
    for key in ("ms", "cpu_ms"):
        base = statistics.median(r["none"][key] for r in rounds)
        summary[f"none_{key}"] = base
        for tracker in variants[1:]:
            value = statistics.median(r[tracker][key] for r in rounds)
            paired = statistics.median((r[tracker][key] - r["none"][key]) * 1e3 for r in rounds)
            summary.setdefault(tracker, {})[key] = {
                "median": value, "ratio_none_over_tracked": base / value, "paired_cost_us": paired,
                "paired_cost_percent": 100 * paired / (base * 1e3)}
            what = "wall" if key == "ms" else "CPU"
            print(f"SUMMARY {args.model} log-interval {args.log_interval} {what}: {tracker} {value:.3f} ms vs none "
                  f"{base:.3f} ms a step (medians of {args.rounds} round medians); none/{tracker} {base / value:.3f}; "
                  f"tracking costs {paired:.0f} us a step = {100 * paired / (base * 1e3):.2f}% (median of paired "
                  "differences)", flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"tracking_{args.model}_log{args.log_interval}.json").write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
