"""How `hvdtrain spark` and `hvdtrain ray` end: the workers' outcome as an exit status and one line."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any


def fit_and_report(where: str, fit: Callable[[], Any]) -> int:
    """Run a launcher's `fit` (it returns rank 0's History); exit 0, 2 for a user error on any rank (e.g. a
    plug-in the workers cannot import: the user's fix, no traceback), 1 for a crash."""
    from hvdtrain.errors import WorkerError
    from hvdtrain.output.console import console

    try:
        history = fit()
    except WorkerError as err:
        if err.user_error:
            console.error(f"error: {err.user_error}")
            return 2
        console.error(f"error: {err}")
        return 1
    summary = history.summary
    acc = summary.get("val_acc")
    console.line(f"hvdtrain: {where} run done: {summary['workers']} worker(s), val_acc "
                 f"{'-' if acc is None else f'{acc:.4f}'}, run dir {summary['run_dir'] or '(none)'}")
    return 0
