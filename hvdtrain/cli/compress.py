"""`hvdtrain compress RUN_DIR --method int8|prune|distill`: a smaller, faster model of a finished run, measured.

Writes a new run directory (default RUN_DIR-METHOD): model.pt2 (torch.export; loads with
`torch.export.load(path).module()`, no hvdtrain needed), compressed.pt (its state_dict), config.yaml,
and report.json / report.txt / report.png comparing parameters, bytes on disk, latency and held-out
accuracy with the original. prune (fine-tune) and distill train with the normal Trainer on every
worker: run under `horovodrun -np N`, or pass `--np N` to have horovodrun started for you. A run of your own
model class is rebuilt from its model.json; where that says it cannot be, `--model module:function` names a builder.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from hvdtrain.cli.args import Commands, Parser, command_parser, positive_int
from hvdtrain.cli.option_flags import add_options, values
from hvdtrain.compression.compress_options import CompressOptions
from hvdtrain.errors import UserError


def parser(commands: Commands | None = None) -> Parser:
    p = command_parser(commands, "compress", __doc__)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a finished training run (config.yaml, model.pt)")
    # Launching is the CLI's own business; what to compress is CompressOptions, shared with the Python API.
    p.add_argument("--np", type=positive_int, default=0,
                   help="prune/distill: start N local workers with horovodrun (default: this process, or the "
                        "workers horovodrun started)")
    p.add_argument("--mpi", action="store_true", help="with --np: MPI instead of Gloo")
    add_options(p, CompressOptions, skip=("verbose",), required=("method",))
    return p


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
    from hvdtrain.compression.compress_api import compress, prepare

    parsed = parser().parse_args(args)
    options = values(parsed, CompressOptions)
    if parsed.np:
        prepare(parsed.run_dir, **options)  # bad input: one line, before any worker starts
        return launch(parsed.np, args, parsed.mpi)
    result = compress(parsed.run_dir, **options)
    return 0 if result["export_ok"] else 1
