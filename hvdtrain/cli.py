"""Command line: `hvdtrain [train] [--config FILE] [--key value ...]`, `predict`, `doctor`, `hosts`, `spark`."""
from __future__ import annotations

import inspect
import re
import sys
from typing import TYPE_CHECKING

from hvdtrain.errors import UserError

if TYPE_CHECKING:
    from hvdtrain.config import TrainConfig

USAGE = """usage: hvdtrain [train] [--config FILE] [--key value ...]
       hvdtrain predict --checkpoint FILE --out FILE [--dataset NAME] [--split val|train] [--procs N]
       hvdtrain doctor
       hvdtrain hosts check FILE | from-env [--format hostfile|H] [-o FILE]
       hvdtrain spark [--num-proc N] [--start-timeout S] [--config FILE] [--key value ...]

Run under horovodrun for several workers, e.g.
  horovodrun -np 2 -H localhost:2 python -m hvdtrain --model cnn --epochs 5

config keys (YAML file and/or --key value; dashes and underscores are the same):
"""


def config_help() -> str:
    from hvdtrain.config import TrainConfig

    lines = []
    for match in re.finditer(r"^    (\w+): ([^=]+)= (.+?)\s+# (.+)$", inspect.getsource(TrainConfig), re.M):
        key, kind, default, doc = match.groups()
        lines.append(f"  --{key.replace('_', '-'):<20} {kind.strip():<16} {default:<10} {doc}")
    return "\n".join(lines)


def config_from_args(args: list[str]) -> TrainConfig:
    """`[--config FILE] [--key value ...]` -> the resolved TrainConfig."""
    from hvdtrain.config import load_config

    path = None
    rest = []
    i = 0
    while i < len(args):
        if args[i] == "--config":
            if i + 1 >= len(args):
                raise UserError("--config needs a file path")
            path = args[i + 1]
            i += 2
            continue
        if args[i].startswith("--config="):
            path = args[i].split("=", 1)[1]
        else:
            rest.append(args[i])
        i += 1
    return load_config(path, rest)


def train_command(args: list[str]) -> int:
    from hvdtrain.stopping import STOP, Stopped
    from hvdtrain.trainer import fit

    config = config_from_args(args)
    STOP.install()
    try:
        fit(config)  # Horovod shuts itself down at exit
    except Stopped as stop:
        print(f"hvdtrain: {stop}", file=sys.stderr, flush=True)
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

    from hvdtrain import dist

    rank = os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    if dist.is_peer_failure(err):
        print(f"hvdtrain: rank {rank} stopped because another rank failed ({err}); "
              "see that rank's error", file=sys.stderr, flush=True)
    else:
        traceback.print_exc()
        print(f"hvdtrain: error: rank {rank} failed: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
    return 1


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help", "help"):
        print(USAGE + config_help())
        return 0
    try:
        if args and args[0] == "doctor":
            from hvdtrain.doctor import main as doctor_main

            return doctor_main()
        if args and args[0] == "hosts":
            from hvdtrain.hosts_cli import main as hosts_main

            return hosts_main(args[1:])
        if args and args[0] == "predict":
            from hvdtrain.predict_cli import predict_command

            return predict_command(args[1:])
        if args and args[0] == "spark":
            from hvdtrain.spark_main import spark_command

            return spark_command(args[1:])
        if args and args[0] == "train":
            args = args[1:]
        return train_command(args)
    except UserError as err:
        print(f"hvdtrain: error: {err}", file=sys.stderr, flush=True)
        return 2
