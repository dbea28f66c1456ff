"""The `hvdtrain` command: `hvdtrain [train] [--config FILE] [--key value ...]`, and one module per other
subcommand (predict, compress, tune, doctor, hosts, spark, launch). Exit codes: 0 done, 2 a user error (one line),
1 a crash, 128+N stopped by signal N."""
from __future__ import annotations

import sys
from collections.abc import Callable

from hvdtrain.cli.args import Parser
from hvdtrain.errors import UserError, peer_failure_of

USAGE = """usage: hvdtrain [train] [--config FILE] [--key value ...]
       hvdtrain predict --checkpoint FILE --out FILE [--dataset NAME] [--split val|train] [--procs N]
       hvdtrain compress RUN_DIR --method int8|prune|distill [--out DIR] [--np N] [options]
       hvdtrain doctor
       hvdtrain hosts check FILE | from-env [--format hostfile|H] [-o FILE]
       hvdtrain spark [--num-proc N] [--start-timeout S] [--config FILE] [--key value ...]
       hvdtrain launch [--secrets-dir DIR] HOROVODRUN_ARGS...   (horovodrun, credentials kept off command lines)
       hvdtrain tune --space FILE --trials N [--np M] [--parallel K] [--mode job|inprocess] [--dir D] [--key value ...]

Run under horovodrun for several workers, e.g.
  horovodrun -np 2 -H localhost:2 python -m hvdtrain --model cnn --epochs 5"""


def train_parser() -> Parser:
    return Parser("hvdtrain train", USAGE, config=True)


def train_command(args: list[str]) -> int:
    from hvdtrain.errors import Stopped
    from hvdtrain.output.console import console
    from hvdtrain.train.signals import STOP
    from hvdtrain.train.trainer import fit

    _, config = train_parser().parse_with_config(args)
    STOP.install()
    try:
        fit(config)  # Horovod shuts itself down at exit
    except Stopped as stop:
        console.error(str(stop))
        return 128 + stop.signum
    except UserError:
        raise
    except Exception as err:
        return _report_crash(err)
    return 0


def _report_crash(err: Exception) -> int:
    """A bug or a failure, not a user mistake: the traceback, then one line naming this rank."""
    import os
    import traceback

    from hvdtrain.output.console import console

    rank = os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    if peer_failure_of(err):
        console.error(f"rank {rank} stopped because another rank failed ({err}); see that rank's error")
    else:
        traceback.print_exc()
        console.error(f"error: rank {rank} failed: {type(err).__name__}: {err}")
    return 1


def _take_secrets() -> None:
    """Before any user code: credentials from HVDTRAIN_SECRETS_FILE, and a warning if some came on a command line."""
    import os

    from hvdtrain.launcher.secrets import leak_warning, load_secrets_file

    loaded = load_secrets_file()
    warning = leak_warning(os.environ, loaded)
    if warning and os.environ.get("HOROVOD_RANK") == "0":  # once per job, not once per worker
        print(f"hvdtrain: {warning}", file=sys.stderr, flush=True)


# Each subcommand is hvdtrain/cli/NAME.py with main(args) -> exit code; imported only when used.
SUBCOMMANDS = ("predict", "compress", "tune", "doctor", "hosts", "spark", "launch")


def _subcommand(name: str) -> Callable[[list[str]], int] | None:
    if name not in SUBCOMMANDS:
        return None
    import importlib

    command: Callable[[list[str]], int] = importlib.import_module(f"hvdtrain.cli.{name}").main
    return command


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        _take_secrets()
        if args and args[0] == "help":
            args = ["--help"]
        command = _subcommand(args[0]) if args else None
        if command is not None:
            return command(args[1:])
        return train_command(args[1:] if args and args[0] == "train" else args)
    except UserError as err:
        print(f"hvdtrain: error: {err}", file=sys.stderr, flush=True)
        return 2
    except SystemExit as done:  # argparse's --help
        return int(done.code or 0)
