"""`option()`: a dataclass field that carries its one-line help, the one place an option is described.

TuneSettings, CompressOptions and the CLI's own option dataclasses declare their fields with it, and
`hvdtrain/cli/option_flags.py` turns those fields into argparse flags, so `--help` and the defaults it shows
cannot drift from the code. (TrainConfig's `option(default, help)` writes the same metadata.)
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any


def option(default: Any = dataclasses.MISSING, help: str = "", *, flag: str | Sequence[str] = "",
           metavar: str = "", choices: Sequence[str] = ()) -> Any:
    """A frozen-dataclass field with its help and, where the CLI differs from the field, how its flag reads.

    Args:
        default: the value when not given; leave it out for a value every caller must give.
        help: one line for `--help` (the generated flag adds "(default: ...)").
        flag: the flag(s) when not `--dashed-name`, e.g. "--sampler-seed" for a field `seed`.
        metavar: the value's name in `--help`.
        choices: the accepted values (the dataclass still validates; the CLI lists them in `--help`).

    Example:
        >>> @dataclasses.dataclass(frozen=True)
        ... class Options:
        ...     repeats: int = option(30, "timed passes (the median is reported)")
    """
    if not help:
        raise TypeError("option() needs its one-line help")
    metadata: dict[str, Any] = {"help": help}
    if flag:
        metadata["flag"] = (flag,) if isinstance(flag, str) else tuple(flag)
    if metavar:
        metadata["metavar"] = metavar
    if choices:
        metadata["choices"] = tuple(choices)
    return dataclasses.field(default=default, metadata=metadata)
