"""`hvdtrain spark [--num-proc N] [--start-timeout S] [--config FILE] [--key value ...]`, and the file
to give spark-submit, which takes a .py file and not a module:

    spark-submit --master spark://HOST:7077 --conf spark.task.cpus=2 \\
        $(python -c 'import hvdtrain.spark_main as m; print(m.__file__)') --num-proc 4 --epochs 5
"""
from __future__ import annotations

import os
import sys


def _take_int(args: list[str], flag: str, default: int) -> tuple[int, list[str]]:
    """Remove `flag N` / `flag=N` from args; the rest are config keys."""
    from hvdtrain.errors import UserError

    value, rest, i = str(default), [], 0
    while i < len(args):
        if args[i] == flag:
            if i + 1 >= len(args):
                raise UserError(f"{flag} needs a number")
            value, i = args[i + 1], i + 2
            continue
        if args[i].startswith(flag + "="):
            value = args[i].split("=", 1)[1]
        else:
            rest.append(args[i])
        i += 1
    if not value.isdigit() or int(value) < 1:
        raise UserError(f"{flag} must be a positive integer, got {value!r}")
    return int(value), rest


def spark_command(args: list[str]) -> int:
    """Train the config given by `args` on Spark; exit 0, 2 for a user error (on any rank), 1 for a crash."""
    from hvdtrain.cli import USAGE, config_from_args, config_help
    from hvdtrain.spark import fit
    from hvdtrain.workers import WorkerError

    if args and args[0] in ("-h", "--help"):
        print(USAGE + config_help())
        return 0
    num_proc, args = _take_int(args, "--num-proc", 2)
    start_timeout, args = _take_int(args, "--start-timeout", 120)
    config = config_from_args(args)  # bad keys fail here, before Spark starts
    try:
        history = fit(config, num_proc=num_proc, start_timeout=start_timeout)
    except WorkerError as err:
        if err.user_error:  # e.g. a plug-in that the executors cannot import: the user's fix, no traceback
            print(f"hvdtrain: error: {err.user_error}", file=sys.stderr, flush=True)
            return 2
        print(f"hvdtrain: error: {err}", file=sys.stderr, flush=True)
        return 1
    summary = history.summary
    acc = summary.get("val_acc")
    print(f"hvdtrain: spark run done: {summary['workers']} worker(s), val_acc "
          f"{'-' if acc is None else f'{acc:.4f}'}, run dir {summary['run_dir'] or '(none)'}", flush=True)
    return 0


if __name__ == "__main__":
    # spark-submit runs this file as a script, which puts its folder (hvdtrain/) first on sys.path: there
    # data.py, config.py, ... would shadow top-level modules of those names, here and in the workers.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    from hvdtrain.cli import main

    sys.exit(main(["spark", *sys.argv[1:]]))
