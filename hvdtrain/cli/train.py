"""`hvdtrain [train] [--config FILE] [--key value ...]`: train a model; the default when no subcommand is named.

Run under horovodrun for several workers, e.g.
  horovodrun -np 2 -H localhost:2 python -m hvdtrain --model cnn --epochs 5
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from hvdtrain.cli.args import Commands, Parser, command_parser
from hvdtrain.errors import UserError, peer_failure_of

if TYPE_CHECKING:
    from hvdtrain.config.train_config import TrainConfig


def parser(commands: Commands | None = None) -> Parser:
    return command_parser(commands, "train", __doc__, config=True)


def main(args: list[str]) -> int:
    from hvdtrain.environment.process import is_rank_zero
    from hvdtrain.errors import Stopped
    from hvdtrain.launcher.slurm_gloo import join as join_slurm_gloo
    from hvdtrain.output.console import console
    from hvdtrain.train.signals import STOP
    from hvdtrain.train.trainer import fit

    config = _config(args)
    joined = join_slurm_gloo()   # Horovod: srun's tasks with no MPI get Gloo's variables and rendezvous
    if joined and is_rank_zero():
        console.line(f"hvdtrain: {joined}")
    STOP.install()   # SIGINT, SIGTERM, SIGUSR1 (a scheduler's early warning): checkpoint and stop
    try:
        fit(config)  # Horovod shuts itself down at exit
    except Stopped as stop:
        console.error(str(stop))
        return 128 + stop.signum
    except UserError:
        raise
    except Exception as err:
        return report_crash(err)
    return 0


def _config(args: list[str]) -> TrainConfig:
    """The config from the command line, with the defaults a Slurm job implies for keys not given there:
    --name slurm-<job id>, and --resume auto once the job was requeued (cluster/slurm.py)."""
    import os

    from hvdtrain.cluster.slurm import with_requeue_defaults
    from hvdtrain.config.train_config import load_config, parse_overrides, read_yaml
    from hvdtrain.output.console import console

    options, rest = parser().parse_known_args(args)
    config = load_config(options.config, rest)
    given = {str(key).replace("-", "_") for key in (read_yaml(options.config) if options.config else {})}
    config, note = with_requeue_defaults(config, given | set(parse_overrides(rest)), os.environ)
    if note:
        console.line(f"hvdtrain: {note}")
    return config


def report_crash(err: Exception) -> int:
    """A bug or a failure, not a user mistake: the traceback, then one line naming this rank."""
    import traceback

    from hvdtrain.environment.process import current
    from hvdtrain.output.console import console

    rank = current().rank  # Horovod's own rank when it got that far, else the launcher's
    if peer_failure_of(err):
        console.error(f"rank {rank} stopped because another rank failed ({err}); see that rank's error")
    else:
        traceback.print_exc()
        console.error(f"error: rank {rank} failed: {type(err).__name__}: {err}")
    return 1
