"""The one argument parser of every subcommand: argparse for the subcommand's own flags; what is
left over are config keys (`--key value`), which the config module checks by name and type.

Each subcommand module has `parser(commands=None)`: called with `hvdtrain`'s subparsers it registers
itself there (what `hvdtrain --help` lists), called alone it is the parser its `main(args)` uses.
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from hvdtrain.errors import UserError

if TYPE_CHECKING:
    from hvdtrain.config.train_config import TrainConfig


class Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line (`hvdtrain: error: ...`) and exit 2, like every hvdtrain error.

    Args:
        prog: e.g. "hvdtrain predict".
        config: also take `--config FILE` and leave `--key value` pairs for the TrainConfig.
    """

    def __init__(self, prog: str, description: str | None = None, *, config: bool = False) -> None:
        super().__init__(prog=prog, description=description, allow_abbrev=False,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
        self.takes_config = config
        if config:
            self.add_argument("--config", metavar="FILE", help="YAML config file; --key value pairs override it")

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{self.prog.removeprefix('hvdtrain ')}: {message} (see `{self.prog} --help`)")

    def format_help(self) -> str:
        text = super().format_help()
        if self.takes_config:
            text += "\nconfig keys (YAML file and/or --key value; dashes and underscores are the same):\n"
            text += config_help() + "\n"
        return text

    def parse_with_config(self, args: list[str]) -> tuple[argparse.Namespace, TrainConfig]:
        """This command's own flags, and the TrainConfig from --config plus the `--key value` rest."""
        from hvdtrain.config.train_config import load_config

        options, rest = self.parse_known_args(args)
        return options, load_config(options.config, rest)


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return int(text)


class Commands(Protocol):
    """`hvdtrain`'s subparsers, as `ArgumentParser.add_subparsers(parser_class=Parser)` returns them."""

    def add_parser(self, name: str, **kwargs: Any) -> Parser: ...


def command_parser(commands: Commands | None, name: str, doc: str | None, *, config: bool = False) -> Parser:
    """The parser of `hvdtrain NAME`, registered in `commands` when given; `doc` is the module docstring.

    Its first sentence, "`hvdtrain NAME ...`: what it does.", gives the one-line summary `hvdtrain --help`
    lists (the usage in backticks may run over several lines).
    """
    text = doc or ""
    first = " ".join(text.split("\n\n", 1)[0].split())
    summary = first.split("`: ", 1)[-1].split(". ", 1)[0].rstrip(".") + "."
    if commands is None:
        return Parser(f"hvdtrain {name}", text, config=config)
    return commands.add_parser(name, help=summary, description=text, config=config)


def config_help() -> str:
    """One line per config key: flag, type, default, help (from the fields' metadata)."""
    from hvdtrain.config.train_config import FIELD_TYPES, TrainConfig

    lines = []
    for item in dataclasses.fields(TrainConfig):
        kind = str(FIELD_TYPES[item.name]).replace("typing.", "").replace("<class '", "").replace("'>", "")
        default = ",".join(map(str, item.default)) if isinstance(item.default, tuple) else item.default
        default = "''" if default == "" else default
        lines.append(f"  --{item.name.replace('_', '-'):<26} {kind:<16} {default!s:<10} {item.metadata['help']}")
    return "\n".join(lines)
