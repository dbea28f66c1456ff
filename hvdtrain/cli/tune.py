"""`hvdtrain tune`: an Optuna search over TrainConfig keys, each trial trained with Horovod.

  hvdtrain tune --space space.yaml --trials 6 --np 2 --parallel 2 --model mlp --epochs 5
  horovodrun -np 2 -H localhost:2 --gloo python -m hvdtrain tune --mode inprocess --space space.yaml --trials 4

Re-running the same command resumes the study in --dir: finished trials are kept, trials a killed run
left behind are marked failed and run again. Results: --dir/best.yaml (python -m hvdtrain --config it),
trials.json, history.png, importance.png, and one run directory per trial under --dir/trials.
"""
from __future__ import annotations

import signal
import sys
from types import FrameType

from hvdtrain.cli.args import Parser, positive_int
from hvdtrain.errors import Stopped
from hvdtrain.tuning.settings import BACKENDS, METRICS, MODES, PRUNERS, SAMPLERS


def parser() -> Parser:
    p = Parser("hvdtrain tune", __doc__, config=True)
    p.add_argument("--space", required=True, metavar="FILE", help="search space YAML: key: {type: float|int|"
                   "categorical, low, high, log, step | choices}")
    p.add_argument("--trials", required=True, type=positive_int, help="finished trials the study should hold")
    p.add_argument("--mode", default="job", choices=MODES,
                   help="job: a horovodrun job per trial (default); inprocess: trials inside this Horovod job")
    p.add_argument("--np", type=positive_int, default=None, help="job mode: workers per trial (default 2)")
    p.add_argument("--parallel", type=positive_int, default=1, help="job mode: trials at a time (default 1)")
    p.add_argument("--hosts", default="", help="job mode: horovodrun -H (default localhost:NP)")
    p.add_argument("--backend", default="gloo", choices=BACKENDS, help="job mode: horovodrun --gloo or --mpi")
    p.add_argument("--dir", default="tune", help="study folder: journal, trials, best.yaml, plots (default tune)")
    p.add_argument("--metric", default="val_acc", choices=tuple(METRICS), help="held-out metric to optimise")
    p.add_argument("--sampler", default="tpe", choices=SAMPLERS)
    p.add_argument("--pruner", default="median", choices=PRUNERS)
    p.add_argument("--pruner-startup", dest="startup_trials", type=int, default=2, metavar="N",
                   help="median pruner: complete trials before any is pruned (default 2)")
    p.add_argument("--pruner-warmup", dest="warmup_epochs", type=int, default=0, metavar="EPOCHS",
                   help="epochs every trial runs before it can be pruned (default 0)")
    p.add_argument("--sampler-seed", dest="seed", type=int, default=0, help="the sampler's seed (--seed is the "
                   "training seed, a config key)")
    p.add_argument("--study", default="hvdtrain", help="study name inside the journal")
    p.add_argument("--max-failures", type=int, default=0, help="stop after N failed trials (default: --trials)")
    return p


def main(args: list[str]) -> int:
    from hvdtrain.errors import ConfigError
    from hvdtrain.tuning.api import tune

    options, config = parser().parse_with_config(args)
    if options.mode == "inprocess" and options.np is not None:
        raise ConfigError("tune: --np is for --mode job; in inprocess mode the trials use the workers "
                          "horovodrun started (horovodrun -np N ... hvdtrain tune --mode inprocess)")
    settings = {key: value for key, value in vars(options).items() if key not in ("space", "trials", "config")}
    settings["np"] = options.np or 2
    if options.mode == "inprocess":
        from hvdtrain.train.signals import STOP

        STOP.install()   # SIGINT/SIGTERM: the ranks agree to stop the running trial; a re-run retries it
    else:
        signal.signal(signal.SIGTERM, _interrupt)   # like Ctrl-C: stop the trial jobs, record them, exit
    try:
        result = tune(options.space, options.trials, config=config, **settings)
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
