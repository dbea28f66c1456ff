"""A/B one training variant at np=2 under different environment settings, alternating A B .. B A.

    python -m benchmarks.ab --model cnn --backend gloo --reps 3 default: cycle5:HOROVOD_CYCLE_TIME=5
    python -m benchmarks.ab --model mlp pinned:HOROVOD_THREAD_AFFINITY=0,1 default:

Each setting is NAME:KEY=VALUE,KEY=VALUE (empty after the colon: the harness's own environment;
VALUE UNSET removes KEY). Settings run in alternating order, one horovodrun job each, so machine
drift hits all of them alike. Prints per-run best/p25/median ms (and the 1-minute load average at
the run's start) and, at the end, best-of-best and the median of the runs' medians. This is how the
tuning decisions in benchmarks/README.md were checked; use it before changing a default.

A setting may name its own variant and backend: NAME@VARIANT[-BACKEND]:..., e.g. `ddp@ddp:` (DDP
under torchrun, the np=2 reference) or `hand@horovod-mpi:`; without @, --variant and --backend.
With --out DIR, the printed lines go to DIR/NAME.log and every run's record to DIR/NAME.json
(NAME: --name, default MODEL_BACKEND).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, launch
from benchmarks.workloads import MODELS


def parse_setting(text: str) -> tuple[str, dict[str, str]]:
    name, sep, pairs = text.partition(":")
    if not sep or not name or name.startswith("@"):
        raise SystemExit(f"benchmarks.ab: setting {text!r} is not NAME:KEY=VALUE,...; e.g. cycle5:HOROVOD_CYCLE_TIME=5")
    env: dict[str, str] = {}
    key = None
    for piece in filter(None, pairs.split(",")):
        if "=" in piece:
            key, _, value = piece.partition("=")
            env[key] = value
        elif key is not None:
            env[key] += "," + piece  # a value with commas, e.g. HOROVOD_THREAD_AFFINITY=0,1
        else:
            raise SystemExit(f"benchmarks.ab: {piece!r} in {text!r} is not KEY=VALUE")
    return name, env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("settings", nargs="+", help="NAME:KEY=VALUE,... (at least two)")
    parser.add_argument("--model", default="mlp", choices=sorted(MODELS))
    parser.add_argument("--backend", default="gloo", choices=["gloo", "mpi"])
    parser.add_argument("--variant", default="hvdtrain", choices=["hvdtrain", "horovod", "allreduce", "compute"])
    parser.add_argument("--out", help="folder for NAME.log and NAME.json (e.g. benchmarks/results/DATE-x-what)")
    parser.add_argument("--name", help="file name stem in --out (default MODEL_BACKEND)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--timeout", type=int, default=300)
    parser.add_argument("--smoke", action="store_true", help="tiny model: checks the tool, not speed")
    parser.add_argument("--compile", action="store_true", help="torch.compile every variant's model "
                        "(hvdtrain alone: a setting HVDTRAIN_ARGS=--compile)")
    args = parser.parse_args()
    settings = [parse_setting(text) for text in args.settings]
    # A setting's HVDTRAIN_ARGS is passed to the hvdtrain variant as flags, e.g. "--nonfinite-limit 0".
    # As benchmarks.run sets it: the repo importable by the workers.
    base = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in settings}
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    say(f"benchmarks.ab model={args.model} np=2 reps={args.reps} steps={args.steps} settings={args.settings}")
    for rep in range(args.reps):
        for name, extra in settings if rep % 2 == 0 else settings[::-1]:
            env = {key: value for key, value in {**base, **extra}.items() if value != "UNSET"}
            unset = [key for key, value in extra.items() if value == "UNSET"]
            flags = ["--hvdtrain-args", env.pop("HVDTRAIN_ARGS")] if "HVDTRAIN_ARGS" in env else []
            load = os.getloadavg()[0]
            rec = launch(launch_spec(name, args.variant, args.backend), 2,
                         ["--steps", str(args.steps), "--warmup", "3", "--threads", "1", "--pin",
                          "--model", args.model, *(["--smoke"] if args.smoke else []),
                          *(["--compile"] if args.compile else []), *flags], env,
                         args.timeout, drop=unset)
            if "error" in rec:
                say(f"rep {rep} {name}: {rec['error']}\n{rec['output_tail'][-800:]}")
                continue
            times = sorted(rec["step_ms"])
            runs[name].append({**rec, "load1_before": load})
            threads = rec.get("threads_cpu") or []
            comm = sum(t["cpu_ms_per_step"] for t in threads if t["born"] == "comm-init")
            main_cpu = sum(t["cpu_ms_per_step"] for t in threads if t["born"] == "main")
            say(f"rep {rep} {name:<14} best {times[0]:7.2f}  p25 {times[len(times) // 4]:7.2f}  "
                f"median {statistics.median(times):7.2f} ms  cpu/step main {main_cpu:6.2f} comm threads "
                f"{comm:6.2f} ms  load {load:.2f}")
    for name, recs in runs.items():
        if recs:
            say(f"SUMMARY {name:<14} best-of-best {min(r['best_ms'] for r in recs):7.2f}  median of medians "
                f"{statistics.median(r['median_ms'] for r in recs):7.2f} ms  ({len(recs)} runs)")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = args.name or f"{args.model}_{args.backend}"
        (out / f"{stem}.log").write_text("\n".join(lines) + "\n")
        (out / f"{stem}.json").write_text(json.dumps({"argv": vars(args), "runs": runs}, indent=1))


def launch_spec(name: str, variant: str, backend: str) -> dict[str, Any]:
    """NAME@VARIANT[-BACKEND] picks its own variant (ddp: torchrun); otherwise --variant/--backend."""
    _, _, own = name.partition("@")
    if own:
        variant, _, own_backend = own.partition("-")
        backend = own_backend or backend
    if variant == "ddp":
        return {"variant": "ddp", "launcher": "torchrun"}
    return {"variant": variant, "launcher": "horovodrun", "backend": backend}


if __name__ == "__main__":
    main()
