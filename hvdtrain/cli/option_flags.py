"""argparse flags generated from an options dataclass whose fields are declared with `config.fields.option`.

Each field becomes one flag: `--dashed-name` (or the field's `flag`), its type from the annotation, its
default and help from the field. argparse only turns text into the field's type; the dataclass itself
checks the values, so a rule is written once and the CLI and the Python API refuse the same things.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import typing
from collections.abc import Iterable
from typing import Any


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def _number(text: str) -> float:
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):  # nan would pass every `x <= 0` check in a dataclass
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return number


def _integers(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(item) for item in text.split(",") if item.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers like 1,64, got {text!r}") from None


TYPES: dict[Any, Any] = {int: _integer, float: _number, str: str, tuple[int, ...]: _integers}


def _shown(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def flags(item: dataclasses.Field[Any]) -> tuple[str, ...]:
    """The flag(s) of a field: its declared `flag`, else `--dashed-name`."""
    declared: tuple[str, ...] = item.metadata.get("flag", ())
    return declared or ("--" + item.name.replace("_", "-"),)


def add_options(parser: argparse.ArgumentParser, cls: type, *, skip: Iterable[str] = (),
                required: Iterable[str] = ()) -> None:
    """One flag per field of dataclass `cls` (but `skip`), with dest = the field's name.

    Args:
        required: fields the command line must give although the dataclass has a default.

    Example:
        >>> add_options(parser, CompressOptions, skip=("verbose",), required=("method",))
    """
    hints = typing.get_type_hints(cls)
    skipped, needed = set(skip), set(required)
    for item in dataclasses.fields(cls):
        if item.name in skipped:
            continue
        if "help" not in item.metadata:
            raise TypeError(f"{cls.__name__}.{item.name} has no help: declare it with option(default, help)")
        kind = hints[item.name]
        kwargs: dict[str, Any] = {"dest": item.name, "help": item.metadata["help"].replace("%", "%%")}
        if "metavar" in item.metadata or kind is int:
            kwargs["metavar"] = item.metadata.get("metavar", "N")
        if item.default is dataclasses.MISSING or item.name in needed:
            kwargs["required"] = True
        else:
            kwargs["default"] = item.default
        if kind is bool:
            # --x / --no-x; argparse adds "(default: ...)" to the help itself
            parser.add_argument(*flags(item), action=argparse.BooleanOptionalAction, **kwargs)
            continue
        if kind not in TYPES:
            raise TypeError(f"{cls.__name__}.{item.name}: no command-line type for {kind}")
        kwargs["type"] = TYPES[kind]
        if "choices" in item.metadata:
            kwargs["choices"] = item.metadata["choices"]
        if "default" in kwargs and item.default not in ("", ()):
            kwargs["help"] += f" (default: {_shown(item.default)})".replace("%", "%%")
        parser.add_argument(*flags(item), **kwargs)


def values(parsed: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields of `cls` that `parsed` holds, ready for `cls(**...)`."""
    return {item.name: getattr(parsed, item.name) for item in dataclasses.fields(cls) if hasattr(parsed, item.name)}
