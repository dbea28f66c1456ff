"""`hvdtrain compress RUN_DIR --method int8|prune|distill`: a smaller, faster model of a finished run, measured.

Writes a new run directory (default RUN_DIR-METHOD): model.pt2 (torch.export; loads with
`torch.export.load(path).module()`, no hvdtrain needed), compressed.pt (its state_dict), config.yaml,
and report.json / report.txt / report.png comparing parameters, bytes on disk, latency and held-out
accuracy with the original. prune (fine-tune) and distill train with the normal Trainer on every
worker: run under `horovodrun -np N`, or pass `--np N` to have horovodrun started for you.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from hvdtrain.cli.args import Parser, positive_int
from hvdtrain.compression.options import METHODS, MODES, CompressOptions
from hvdtrain.errors import UserError

DEFAULTS = CompressOptions()


def _batch_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(item) for item in text.split(",") if item.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"must be positive integers like 1,64, got {text!r}")
    return sizes


def parser() -> Parser:
    p = Parser("hvdtrain compress", __doc__)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a finished training run (config.yaml, model.pt)")
    p.add_argument("--method", required=True,
                   help=f"{', '.join(METHODS)}, or several comma-separated (e.g. int8,prune) to compare them")
    p.add_argument("--out", default="", help="new run directory (default RUN_DIR-METHOD)")
    p.add_argument("--np", type=positive_int, default=0,
                   help="prune/distill: start N local workers with horovodrun (default: this process, or the "
                        "workers horovodrun started)")
    p.add_argument("--mpi", action="store_true", help="with --np: MPI instead of Gloo")
    p.add_argument("--int8-mode", default=DEFAULTS.int8_mode, choices=MODES,
                   help="auto: static PT2E for models with Conv2d, dynamic otherwise")
    p.add_argument("--calibration", type=positive_int, default=DEFAULTS.calibration,
                   help="training samples that calibrate static int8")
    p.add_argument("--sparsity", type=float, default=DEFAULTS.sparsity,
                   help="prune: share of each hidden layer's channels/neurons removed")
    p.add_argument("--epochs", type=int, default=DEFAULTS.epochs,
                   help="prune: fine-tune epochs (0 = 3); distill: student epochs (0 = the source run's)")
    p.add_argument("--lr", type=float, default=DEFAULTS.lr, help="prune/distill: one-worker LR (0 = the source's)")
    p.add_argument("--student", default=DEFAULTS.student, help="distill: mlp, cnn or a plug-in 'module:function'")
    p.add_argument("--student-hidden", type=positive_int, default=DEFAULTS.student_hidden,
                   help="distill: the student's hidden width")
    p.add_argument("--temperature", type=float, default=DEFAULTS.temperature, help="distill: softmax temperature")
    p.add_argument("--alpha", type=float, default=DEFAULTS.alpha, help="distill: weight of the teacher's targets")
    p.add_argument("--no-baseline", action="store_true",
                   help="distill: skip training the student without the teacher for comparison")
    p.add_argument("--threads", type=positive_int, default=DEFAULTS.threads, help="torch threads while timing")
    p.add_argument("--repeats", type=positive_int, default=DEFAULTS.repeats, help="timed passes (median reported)")
    p.add_argument("--batch-sizes", type=_batch_sizes, default=DEFAULTS.batch_sizes, help="latency batch sizes")
    p.add_argument("--compile", action="store_true",
                   help="also time every model after torch.compile (inductor): int8's fused kernels; slow to compile")
    return p


def options(parsed: argparse.Namespace) -> dict[str, Any]:
    return {"out": parsed.out, "int8_mode": parsed.int8_mode, "calibration": parsed.calibration,
            "sparsity": parsed.sparsity, "epochs": parsed.epochs, "lr": parsed.lr, "student": parsed.student,
            "student_hidden": parsed.student_hidden, "temperature": parsed.temperature, "alpha": parsed.alpha,
            "baseline": not parsed.no_baseline, "threads": parsed.threads, "repeats": parsed.repeats,
            "batch_sizes": parsed.batch_sizes, "compiled": parsed.compile}


def _without_np(args: list[str]) -> list[str]:
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--np":
            skip = True
        elif not arg.startswith("--np=") and arg != "--mpi":
            kept.append(arg)
    return kept


def launch(np: int, args: list[str], mpi: bool) -> int:
    """Run this same command (without --np) on `np` local workers under horovodrun; its exit code."""
    horovodrun = Path(sys.executable).with_name("horovodrun")
    found = str(horovodrun) if horovodrun.exists() else shutil.which("horovodrun")
    if not found:
        raise UserError("--np needs horovodrun (Horovod's launcher); run `hvdtrain doctor`")
    # Horovod: N workers on this host over loopback; every one runs `hvdtrain compress` and trains.
    command = [found, "-np", str(np), "-H", f"localhost:{np}", "--mpi" if mpi else "--gloo",
               "--network-interfaces", "lo", "--start-timeout", "120", "--disable-cache",
               sys.executable, "-m", "hvdtrain", "compress", *_without_np(args)]
    return subprocess.call(command)


def main(args: list[str]) -> int:
    from hvdtrain.compression.api import compress, prepare

    parsed = parser().parse_args(args)
    if parsed.np:
        prepare(parsed.run_dir, parsed.method, **options(parsed))  # bad input: one line, before any worker starts
        return launch(parsed.np, args, parsed.mpi)
    result = compress(parsed.run_dir, parsed.method, **options(parsed))
    return 0 if result["export_ok"] else 1
