"""`hvdtrain spark [--num-proc N] [--start-timeout S] [--config FILE] [--key value ...]`: train on Spark.

spark-submit takes a file, not a module: hvdtrain/cli/entry/spark_submit.py runs this command.
"""
from __future__ import annotations

from dataclasses import dataclass

from hvdtrain.cli.args import Commands, Parser, command_parser
from hvdtrain.cli.option_flags import add_options, values
from hvdtrain.config.fields import option
from hvdtrain.errors import UserError


@dataclass(frozen=True)
class SparkOptions:
    num_proc: int = option(2, "Horovod workers (Spark tasks)")
    start_timeout: int = option(120, "seconds for all tasks to start")

    def __post_init__(self) -> None:
        for key in ("num_proc", "start_timeout"):
            if getattr(self, key) < 1:
                raise UserError(f"spark: --{key.replace('_', '-')} must be >= 1, got {getattr(self, key)}")


def parser(commands: Commands | None = None) -> Parser:
    p = command_parser(commands, "spark", __doc__, config=True)
    add_options(p, SparkOptions)
    return p


def main(args: list[str]) -> int:
    """Train the config given by `args` on Spark; exit 0, 2 for a user error (on any rank), 1 for a crash."""
    from hvdtrain.cli.remote_fit import fit_and_report
    from hvdtrain.spark.spark_fit import fit

    parsed, config = parser().parse_with_config(args)  # bad keys fail here, before Spark starts
    options = SparkOptions(**values(parsed, SparkOptions))
    return fit_and_report("spark", lambda: fit(config, num_proc=options.num_proc,
                                               start_timeout=options.start_timeout))
