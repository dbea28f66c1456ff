"""Command line: `hvdtrain [train] [--config FILE] [--key value ...]` and `hvdtrain doctor`."""
from __future__ import annotations

import inspect
import re
import sys
from typing import TYPE_CHECKING

from hvdtrain.errors import UserError

if TYPE_CHECKING:
    from hvdtrain.config import TrainConfig

USAGE = """usage: hvdtrain [train] [--config FILE] [--key value ...]
       hvdtrain doctor
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
    from hvdtrain.trainer import fit

    fit(config_from_args(args))  # Horovod shuts itself down at exit
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help", "help"):
        print(USAGE + config_help())
        return 0
    try:
        if args and args[0] == "doctor":
            from hvdtrain.doctor import main as doctor_main

            return doctor_main()
        if args and args[0] == "spark":
            from hvdtrain.spark_main import spark_command

            return spark_command(args[1:])
        if args and args[0] == "train":
            args = args[1:]
        return train_command(args)
    except UserError as err:
        print(f"hvdtrain: error: {err}", file=sys.stderr, flush=True)
        return 2
