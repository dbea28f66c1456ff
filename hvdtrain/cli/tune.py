"""`hvdtrain tune`: an Optuna search over TrainConfig keys, each trial trained with Horovod.

  hvdtrain tune --space space.yaml --trials 6 --np 2 --parallel 2 --model mlp --epochs 5
  horovodrun -np 2 -H localhost:2 --gloo python -m hvdtrain tune --mode inprocess --space space.yaml --trials 4
  hvdtrain tune --space space.yaml --trials 8 --train-fn mymod:train   # your model: mymod.py's train(config)

Re-running the same command resumes the study in --dir: finished trials are kept, trials a killed run
left behind are marked failed and run again. Results: --dir/best.yaml (python -m hvdtrain --config it),
trials.json, history.png, importance.png, and one run directory per trial under --dir/trials.
"""
from __future__ import annotations

import signal
import sys
from types import FrameType

from hvdtrain.cli.args import Commands, Parser, command_parser
from hvdtrain.cli.option_flags import add_options, values
from hvdtrain.errors import Stopped
from hvdtrain.tuning.tune_settings import TuneSettings


def parser(commands: Commands | None = None) -> Parser:
    p = command_parser(commands, "tune", __doc__, config=True)
    p.add_argument("--space", required=True, metavar="FILE", help="search space YAML: key: {type: float|int|"
                   "categorical, low, high, log, step | choices}")
    add_options(p, TuneSettings)
    return p


def main(args: list[str]) -> int:
    from hvdtrain.errors import ConfigError
    from hvdtrain.tuning.tune_api import tune

    cli = parser()
    parsed, config = cli.parse_with_config(args)
    settings = values(parsed, TuneSettings)
    # Only a changed --np is caught: the default cannot be told apart from `--np 2` once parsed.
    if settings["mode"] == "inprocess" and settings["np"] != cli.get_default("np"):
        raise ConfigError("tune: --np is for --mode job; in inprocess mode the trials use the workers "
                          "horovodrun started (horovodrun -np N ... hvdtrain tune --mode inprocess)")
    if settings["mode"] == "inprocess":
        from hvdtrain.train.signals import STOP

        STOP.install()   # SIGINT/SIGTERM: the ranks agree to stop the running trial; a re-run retries it
    else:
        # Like Ctrl-C: stop the trial jobs, record them, remove the secrets file, exit. SIGHUP too: a closed
        # terminal would otherwise end this process with no cleanup at all.
        # USR1: Slurm's early warning to the batch shell (--signal=B:USR1@T), which would otherwise end us at once.
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(signum, _interrupt)
    try:
        result = tune(parsed.space, config=config, **settings)
    except KeyboardInterrupt:
        console_line("tune: stopped; the running trials are queued again: re-run the same command to resume")
        return 130
    except Stopped as stop:
        console_line(f"tune: {stop}; the trial is queued again: re-run the same command to resume")
        return 128 + stop.signum
    return 0 if result.best_number is not None else 1


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def console_line(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
