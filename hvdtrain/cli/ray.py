"""`hvdtrain ray [--address ADDR] [--np N] [--cpus-per-worker C] [--gpus-per-worker G] [--config FILE]
[--key value ...]`: train on a Ray cluster, one Horovod worker per Ray actor. With `--elastic true
[--min-np M] [--max-np X]` the job goes on when nodes are lost and grows as nodes join.

Run it where Ray can reach the cluster: on a node of it, from a driver machine with `--address`, or
as a Ray job (`ray job submit --address http://HEAD:8265 -- hvdtrain ray --np 4 ...`), where RAY_ADDRESS
already points at the cluster.
"""
from __future__ import annotations

from dataclasses import dataclass

from hvdtrain.cli.args import Commands, Parser, command_parser
from hvdtrain.cli.option_flags import add_options, values
from hvdtrain.config.fields import option
from hvdtrain.errors import UserError
from hvdtrain.ray.worker import STRATEGIES


@dataclass(frozen=True)
class RayOptions:
    address: str = option("", "Ray cluster (HOST:6379, ray://HOST:10001, auto); default: RAY_ADDRESS, "
                              "else a local Ray")
    np: int = option(2, "Horovod workers (Ray actors)")
    cpus_per_worker: int = option(1, "CPUs each actor reserves")
    gpus_per_worker: int = option(0, "GPUs each actor reserves (each worker trains on its own)")
    strategy: str = option("SPREAD", "placement group strategy", choices=STRATEGIES)
    start_timeout: int = option(120, "seconds for Ray to place every actor")
    min_np: int = option(1, "with --elastic true: go on while at least this many workers remain")
    max_np: int = option(0, "with --elastic true: grow up to this many workers as nodes join; 0 = --np")

    def __post_init__(self) -> None:
        for key in ("np", "start_timeout", "min_np"):
            if getattr(self, key) < 1:
                raise UserError(f"ray: --{key.replace('_', '-')} must be >= 1, got {getattr(self, key)}")
        for key in ("cpus_per_worker", "gpus_per_worker", "max_np"):
            if getattr(self, key) < 0:
                raise UserError(f"ray: --{key.replace('_', '-')} must be >= 0, got {getattr(self, key)}")
        if self.cpus_per_worker + self.gpus_per_worker == 0:
            raise UserError("ray: each worker needs a CPU or a GPU; give --cpus-per-worker or --gpus-per-worker")
        if self.strategy.upper() not in STRATEGIES:
            raise UserError(f"ray: --strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")


def parser(commands: Commands | None = None) -> Parser:
    p = command_parser(commands, "ray", __doc__, config=True)
    add_options(p, RayOptions)
    return p


def main(args: list[str]) -> int:
    """Train the config given by `args` on Ray; exit 0, 2 for a user error (on any rank), 1 for a crash."""
    from hvdtrain.cli.remote_fit import fit_and_report
    from hvdtrain.ray.ray_fit import fit

    parsed, config = parser().parse_with_config(args)  # bad keys fail here, before Ray starts
    options = RayOptions(**values(parsed, RayOptions))
    return fit_and_report("ray", lambda: fit(
        config, num_workers=options.np, cpus_per_worker=options.cpus_per_worker,
        gpus_per_worker=options.gpus_per_worker, address=options.address or None,
        strategy=options.strategy, start_timeout=options.start_timeout, min_workers=options.min_np,
        max_workers=options.max_np or None))
