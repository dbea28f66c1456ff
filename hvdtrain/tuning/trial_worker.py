"""What each worker of a job-mode trial runs when the study has a train_fn (`python -m hvdtrain` otherwise):

  python -m hvdtrain.tuning.trial_worker --train-fn mymod:train --config tune/trials/trial-0003.yaml

It trains as `python -m hvdtrain` does (credentials from the secrets file, Gloo over srun, SIGTERM agreed by
every rank and answered with exit 143, `hvdtrain: error: ...` and exit 2 for a user's mistake), with the model and
data `train_fn(config)` builds. Run it under horovodrun with tune/best.yaml to train the best trial again.
"""
from __future__ import annotations

import argparse
import sys

from hvdtrain.errors import Stopped, UserError


def main(argv: list[str] | None = None) -> int:
    from hvdtrain.config.train_config import load_config
    from hvdtrain.output.console import console
    from hvdtrain.train.run_start import prepare_run, report_crash
    from hvdtrain.tuning.train_fn import fit_trial, resolve

    parser = argparse.ArgumentParser(prog="python -m hvdtrain.tuning.trial_worker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-fn", required=True, metavar="MODULE:FUNCTION")
    parser.add_argument("--config", required=True, metavar="FILE", help="the trial's config (or tune/best.yaml)")
    args = parser.parse_args(argv)
    try:
        train_fn, config = resolve(args.train_fn), load_config(args.config)
        # The start `python -m hvdtrain` makes (train/run_start.py): credentials from the secrets file, srun's Gloo,
        # and SIGTERM (the pruner's, a scheduler's) agreed by every rank, exit 143. The trial's name and folder are
        # the study's: every key of its config counts as given.
        setup = prepare_run(config, given=set(config.to_dict()))
        with setup.stops():
            fit_trial(train_fn, setup.config)
    except Stopped as stop:
        console.error(str(stop))
        return 128 + stop.signum
    except UserError as err:
        console.error(f"error: {err}")
        return 2
    except Exception as err:  # a bug in train_fn or ours: the traceback, then one line naming the rank
        return report_crash(err)
    return 0


if __name__ == "__main__":
    sys.exit(main())
