"""The `hvdtrain` command: `hvdtrain [train] [--config FILE] [--key value ...]`, and one module per other
subcommand. Exit codes: 0 done, 2 a user error (one line), 1 a crash, 128+N stopped by signal N."""
from __future__ import annotations

import importlib
import sys
from types import ModuleType

from hvdtrain.cli.args import Parser
from hvdtrain.errors import UserError

# Each is hvdtrain/cli/NAME.py with parser(commands=None) and main(args) -> exit code. A module imports
# heavy things (torch, Horovod, Optuna) inside main, so `--help` and the other subcommands stay fast.
SUBCOMMANDS = ("train", "predict", "compress", "tune", "doctor", "hosts", "spark", "ray", "launch")


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"hvdtrain.cli.{name}")


def parser() -> Parser:
    """`hvdtrain --help`: the subcommands, each registered by its own module, then train's config keys."""
    top = Parser("hvdtrain", "Data-parallel PyTorch training with Horovod. With no COMMAND, `hvdtrain` trains: "
                 "`hvdtrain --key value` is `hvdtrain train --key value`.", config=True)
    commands = top.add_subparsers(title="commands", metavar="COMMAND", parser_class=Parser)
    for name in SUBCOMMANDS:
        _module(name).parser(commands)
    return top


def _take_secrets() -> None:
    """Before any user code: credentials from HVDTRAIN_SECRETS_FILE, and a warning if some came on a command line."""
    import os

    from hvdtrain.environment.process import is_rank_zero
    from hvdtrain.launcher.worker_start import take_secrets

    warning = take_secrets(os.environ)   # as every worker of `hvdtrain launch` does before its command
    if warning and is_rank_zero():  # once per job, not once per worker: Horovod is not up yet, the launcher says
        print(f"hvdtrain: {warning}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        _take_secrets()
        if args[:1] in (["help"], ["-h"], ["--help"]):
            parser().print_help()
            return 0
        # No subcommand is train: its `--key value` pairs cannot go through the subparsers, whose
        # positional COMMAND would take a config value such as `cnn` for a command name.
        name = args[0] if args and args[0] in SUBCOMMANDS else "train"
        command: int = _module(name).main(args[1:] if args and args[0] == name else args)
        return command
    except UserError as err:
        print(f"hvdtrain: error: {err}", file=sys.stderr, flush=True)
        return 2
    except SystemExit as done:  # argparse's --help
        return int(done.code or 0)
