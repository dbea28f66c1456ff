"""`hvdtrain [train] [--config FILE] [--key value ...]`: train a model; the default when no subcommand is named.

Run under horovodrun for several workers, e.g.
  horovodrun -np 2 -H localhost:2 python -m hvdtrain --model cnn --epochs 5
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from hvdtrain.cli.args import Commands, Parser, command_parser
from hvdtrain.errors import UserError

if TYPE_CHECKING:
    from hvdtrain.config.train_config import TrainConfig


def parser(commands: Commands | None = None) -> Parser:
    return command_parser(commands, "train", __doc__, config=True)


def main(args: list[str]) -> int:
    from hvdtrain.errors import Stopped
    from hvdtrain.output.console import console
    from hvdtrain.train.config_fit import fit
    from hvdtrain.train.run_start import PROCESS, prepare_run, report_crash

    PROCESS.secrets_taken = True   # cli/main.py took them before any subcommand (the same take_secrets)
    # The start a script's Trainer makes too (train/run_start.py): srun's Gloo, Slurm's requeue defaults for the keys
    # not given here, and SIGINT/SIGTERM/SIGUSR1 (a scheduler's early warning) checkpoint and stop, from here on.
    config, given = _command_line(args)
    setup = prepare_run(config, given=given)
    try:
        with setup.stops():
            fit(setup.config)  # Horovod shuts itself down at exit
    except Stopped as stop:
        console.error(str(stop))
        return 128 + stop.signum
    except UserError:
        raise
    except Exception as err:
        return report_crash(err)
    return 0


def _command_line(args: list[str]) -> tuple[TrainConfig, set[str]]:
    """The config from the command line (--config FILE, then --key value), and the keys given there."""
    from hvdtrain.config.train_config import load_config, parse_overrides, read_yaml

    options, rest = parser().parse_known_args(args)
    given = {str(key).replace("-", "_") for key in (read_yaml(options.config) if options.config else {})}
    return load_config(options.config, rest), given | set(parse_overrides(rest))


def _config(args: list[str]) -> TrainConfig:
    """The config `hvdtrain train ARGS` trains with here, as prepare_run() makes it: with the defaults a Slurm job
    implies for keys not given (--name slurm-<job id>; --resume auto once the job was requeued;
    cluster/slurm_requeue.py)."""
    import os

    from hvdtrain.cluster.slurm_requeue import with_requeue_defaults

    return with_requeue_defaults(*_command_line(args), os.environ)[0]
