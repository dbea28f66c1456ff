"""`hvdtrain spark [--num-proc N] [--start-timeout S] [--config FILE] [--key value ...]`: train on Spark.

spark-submit takes a file, not a module: hvdtrain/cli/entry/spark_submit.py runs this command.
"""
from __future__ import annotations

from hvdtrain.cli.args import Parser, positive_int


def main(args: list[str]) -> int:
    """Train the config given by `args` on Spark; exit 0, 2 for a user error (on any rank), 1 for a crash."""
    from hvdtrain.errors import WorkerError
    from hvdtrain.output.console import console
    from hvdtrain.spark.runner import fit

    parser = Parser("hvdtrain spark", __doc__, config=True)
    parser.add_argument("--num-proc", type=positive_int, default=2, help="Horovod workers (Spark tasks)")
    parser.add_argument("--start-timeout", type=positive_int, default=120,
                        help="seconds for all tasks to start")
    options, config = parser.parse_with_config(args)  # bad keys fail here, before Spark starts
    try:
        history = fit(config, num_proc=options.num_proc, start_timeout=options.start_timeout)
    except WorkerError as err:
        if err.user_error:  # e.g. a plug-in that the executors cannot import: the user's fix, no traceback
            console.error(f"error: {err.user_error}")
            return 2
        console.error(f"error: {err}")
        return 1
    summary = history.summary
    acc = summary.get("val_acc")
    console.line(f"hvdtrain: spark run done: {summary['workers']} worker(s), val_acc "
                 f"{'-' if acc is None else f'{acc:.4f}'}, run dir {summary['run_dir'] or '(none)'}")
    return 0
