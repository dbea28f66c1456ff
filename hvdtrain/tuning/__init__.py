"""Hyperparameter search on Horovod with Optuna (`hvdtrain tune`, `hvdtrain.tune`).

space.py (the search space: parsing, checks), tune_settings.py (how a study runs), study.py (journal storage,
resume, recovery), train_fn.py (what a trial trains: your train_fn or the built-ins), job_runner.py (a
horovodrun job per trial; trial_worker.py is a train_fn trial's worker program), inprocess.py (trials inside
one Horovod job), study_report.py (lines, table, best.yaml, plots), tune_api.py (the entry point).
"""
from __future__ import annotations

from hvdtrain.tuning.tune_api import TuneResult, tune

__all__ = ["TuneResult", "tune"]
