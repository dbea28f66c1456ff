"""Train on Apache Spark: N Horovod workers run inside N Spark tasks (horovod.spark.run, Gloo); on a
DataFrame, see dataframe.py.

The same trainer, config and plug-ins as under horovodrun; only the launcher differs. Like
launcher.py, this module uses Horovod's launcher (horovod.spark), never its torch binding: the
Spark driver does not initialise Horovod; the workers do. Gloo only: Horovod's MPI path inside
Spark needs mpirun on every executor and failed where we tried it.
"""
from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.environment.credentials import split_env
from hvdtrain.errors import LaunchError, UserError, WorkerError
from hvdtrain.launcher.guard import (
    Guarded,
    check_picklable,
    patched_environ,
    rank0_result,
    target,
    worker_pythonpath,
)
from hvdtrain.train.device import threads_per_worker


def local_slots(master: str, task_cpus: int, cpu_count: int) -> int | None:
    """How many tasks a local master runs at once; None for a cluster (its executors may still be joining).

    Example:
        >>> local_slots("local[4]", 2, 8), local_slots("local[*]", 1, 8), local_slots("spark://h:7077", 1, 8)
        (2, 8, None)
    """
    if master == "local":
        cores = 1
    elif match := re.fullmatch(r"local\[(\*|\d+)(?:,\s*\d+)?\]", master):
        cores = cpu_count if match.group(1) == "*" else int(match.group(1))
    elif match := re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*\d+\]", master):
        cores = int(match.group(1)) * int(match.group(2))
    else:
        return None
    return cores // task_cpus


def _start_session(num_proc: int) -> Any:
    """A SparkSession for this run when the caller has none: spark-submit's, or a local one."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("hvdtrain")
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # under spark-submit or the pyspark shell: use their master/confs
        session = builder.getOrCreate()
        print(f"hvdtrain: started a SparkSession on {session.sparkContext.master}", file=sys.stderr, flush=True)
        return session
    # Every rank gets an equal share of this machine's cores, as under horovodrun on one host.
    task_cpus = threads_per_worker(num_proc)
    # Without SPARK_LOCAL_IP Spark binds to the machine's external address; without PYSPARK_PYTHON its
    # Python workers run `python3` from PATH, which may lack hvdtrain and Horovod. Both are read at start.
    with patched_environ(defaults={"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}):
        session = (builder.master(f"local[{num_proc * task_cpus}]")
                   .config("spark.task.cpus", str(task_cpus))
                   .config("spark.ui.showConsoleProgress", "false")  # its bar garbles the workers' lines
                   .getOrCreate())
    print(f"hvdtrain: no active SparkSession; started a local one ({session.sparkContext.master}, "
          f"{task_cpus} core(s) per task); it is stopped after this run", file=sys.stderr, flush=True)
    return session


def _spark_config(config: TrainConfig, task_cpus: int) -> TrainConfig:
    # run_dir is resolved here, as horovodrun's workers resolve it against the launching directory;
    # a Spark task's own working directory is a scratch folder on its executor.
    changes: dict[str, Any] = {}
    if config.run_dir:
        changes["run_dir"] = os.path.abspath(config.run_dir)
    if not config.threads:  # Spark's CPU accounting: a task owns spark.task.cpus cores, not the host
        changes["threads"] = task_cpus
    return dataclasses.replace(config, **changes)


def fit(config_or_fn: TrainConfig | Callable[..., Any] | Any = None, *args: Any, df: Any = None,
        feature_cols: Sequence[str] | str = (), label_cols: Sequence[str] | str = (),
        validation: float | str | None = 0.2, store: str | None = None, run_id: str | None = None,
        partitions: int | None = None, row_group_mb: int = 8, loss_fn: Any = None,
        metrics: Any = None, num_proc: int = 2, spark: Any = None, all_ranks: bool = False, start_timeout: int = 120,
        network_interfaces: list[str] | None = None, env: dict[str, str] | None = None, **kwargs: Any) -> Any:
    """Train on `num_proc` Spark tasks, one Horovod worker (Gloo) each.

    Two forms:

    - `fit(config_or_fn, ...)`: every task runs `hvdtrain.fit(config)` or your function; returns rank
      0's result (for a TrainConfig: its History).
    - `fit(model_or_config, df=df, feature_cols=[...], label_cols=[...], store=PATH, ...)`: trains on a
      DataFrame (spark/dataframe.py) and returns a SparkModel whose `transform(df)` predicts into one.

    Rank 0 writes the run directory (config.run_dir, made absolute on the driver). On a cluster that
    path is on the executor that runs rank 0: use shared storage (NFS, a mounted bucket) for run_dir
    or the files stay on that executor. A config with threads 0 gets spark.task.cpus torch threads
    per worker: the cores Spark reserved for each task.

    Args:
        config_or_fn: a TrainConfig (trains with `hvdtrain.fit(config)` on every task), or a function
            to run on every task (it may build its own hvdtrain.Trainer). With df: a torch.nn.Module,
            a TrainConfig (its model is built for the data's width and classes), or None (config.model).
        *args: arguments for the function; they must be picklable (cloudpickle).
        **kwargs: keyword arguments for the function, picklable as well. With df, they are config
            values (epochs=5, lr=0.05, batch_size=64, ...).
        df: a Spark DataFrame to train on.
        feature_cols: numeric columns, arrays of numbers or ML vectors; concatenated into one float vector.
        label_cols: one column (integers/strings/booleans: classes; floats: regression), or several float
            columns (one multi-output regression target).
        validation: the fraction of rows held out (chosen by rand(seed)), a boolean/0-1 column marking
            them, or None.
        store: where the DataFrame is written once as Parquet: a local or shared folder, or a URL
            pyarrow or fsspec opens (hdfs://, s3://, gs://...). Every executor must reach it.
        run_id: names the materialisation (default: a digest of the DataFrame's plan and the columns);
            an existing one is reused without writing.
        partitions: repartition to this many Parquet files before writing (default: the DataFrame's).
        row_group_mb: Parquet row group size; a rank holds about two of these (Arrow + tensor) at a time.
        loss_fn, metrics: as for hvdtrain.Trainer.
        num_proc: number of Horovod workers = concurrent Spark tasks; the session needs that many slots.
        spark: the SparkSession to use. Default: the active one (df's with df); else, under
            spark-submit, the one it configured; else a local[num_proc] session, stopped afterwards.
        all_ranks: return every rank's result as a list instead of rank 0's (not with df).
        start_timeout: seconds to wait for Spark to start all `num_proc` tasks.
        network_interfaces: NICs for Horovod's traffic; default ["lo"] on a local master, else all
            interfaces common to the executors.
        env: extra environment variables for the workers (PYTHONPATH is set to this process's).
    Returns:
        Rank 0's return value (for a TrainConfig: its History), the list of all ranks' values, or
        with df a SparkModel (`.model`, `.history`, `.transform(df)`).
    Raises:
        WorkerError: a worker raised; the message names the rank, its host and its traceback.
        LaunchError: bad arguments, too few task slots, or Spark could not start the tasks.
        UserError: with df, a missing or non-numeric column, an empty DataFrame, fewer rows than workers.
    Example:
        >>> history = hvdtrain.spark.fit(hvdtrain.load_config(model="mlp", epochs=5), num_proc=2, spark=spark)
        >>> result = hvdtrain.spark.fit(MyNet(), df=df, feature_cols=["features"], label_cols=["label"],
        ...                             store="/shared/hvdtrain-store", num_proc=2, epochs=5)
        >>> result.transform(test_df).select("label", "prediction").show()
    """
    if num_proc < 1:
        raise LaunchError(f"num_proc must be >= 1, got {num_proc}")
    if df is not None:
        from hvdtrain.spark.dataframe import fit_dataframe

        def launch(fn: Callable[..., Any], job: Any) -> list[Any]:
            return _on_spark(fn, (job,), {}, num_proc, spark or df.sparkSession, True, start_timeout,
                             network_interfaces, env)

        return fit_dataframe(config_or_fn, df, feature_cols=feature_cols, label_cols=label_cols,
                             validation=validation, store=store, num_proc=num_proc, run_id=run_id,
                             partitions=partitions, row_group_mb=row_group_mb, loss_fn=loss_fn,
                             metrics=metrics, launch=launch, overrides=kwargs)
    fn, args = target(config_or_fn, args, "hvdtrain.spark.fit")
    return _on_spark(fn, args, kwargs, num_proc, spark, all_ranks, start_timeout, network_interfaces, env)


def _on_spark(fn: Callable[..., Any], args: tuple, kwargs: dict, num_proc: int, spark: Any, all_ranks: bool,
              start_timeout: int, network_interfaces: list[str] | None, env: dict[str, str] | None) -> Any:
    check_picklable(fn, args, kwargs)
    try:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession
    except ImportError as err:
        raise UserError(f"Spark support needs pyspark ({err}); install it with: pip install -e '.[spark]' "
                        "in hvdtrain's checkout") \
            from None

    created = None
    if spark is None and SparkContext._active_spark_context is not None:
        spark = SparkSession.builder.getOrCreate()  # the running context's session: creates nothing
    if spark is None:
        spark = created = _start_session(num_proc)
    try:
        context = spark.sparkContext
        task_cpus = int(context.getConf().get("spark.task.cpus", "1"))
        slots = local_slots(context.master, task_cpus, os.cpu_count() or 1)
        if slots is not None and slots < num_proc:
            raise LaunchError(f"num_proc {num_proc} needs {num_proc} concurrent Spark tasks but master "
                              f"{context.master} with spark.task.cpus={task_cpus} runs {slots}; "
                              "use fewer processes or more cores")
        from hvdtrain.spark.dataframe import DataFrameJob

        args = tuple(_spark_config(a, task_cpus) if isinstance(a, TrainConfig) else
                     dataclasses.replace(a, config=_spark_config(a.config, task_cpus))
                     if isinstance(a, DataFrameJob) else a for a in args)
        if network_interfaces is None and slots is not None:
            network_interfaces = ["lo"]
        # Workers import what this process can: functions pickled by reference need their modules.
        public, secrets = split_env(env or {})
        worker_env = {**public, "PYTHONPATH": worker_pythonpath(os.environ.get("PYTHONPATH", ""))}
        # Horovod would start the workers with this process's Python; the executors' may live elsewhere.
        # Credentials ride in the pickled job, like launch()'s (Spark's env goes by RPC today, but one rule).
        results = _run(Guarded(fn, args, kwargs, secrets), num_proc, start_timeout, network_interfaces, worker_env,
                       context.pythonExec)
    finally:
        if created is not None:
            created.stop()
    return rank0_result(results, all_ranks)


def _run(guarded: Guarded, num_proc: int, start_timeout: int, nics: list[str] | None,
         env: dict[str, str], python: str) -> list[Any]:
    try:
        from hvdtrain.distributed import horovod_runner

        spark_run, TimeoutException = horovod_runner.spark_run()
    except ImportError as err:
        raise UserError(f"Horovod is not usable here ({err}); run `make setup` or scripts/install-horovod, "
                        "then `hvdtrain doctor`") from None
    try:
        # Workers' output comes back to this process, prefixed [rank]<stdout>, even from a cluster.
        return spark_run(guarded, num_proc=num_proc, use_gloo=True, start_timeout=start_timeout, nics=nics,
                         env=env, stdout=sys.stdout, stderr=sys.stderr, verbose=0, executable=python)
    except TimeoutException:
        raise LaunchError(f"Spark did not run {num_proc} tasks at once within {start_timeout} s: the cluster "
                          f"needs {num_proc} free task slots (executor cores / spark.task.cpus; with dynamic "
                          "allocation, enough minExecutors); raise --start-timeout if executors start slowly") \
            from None
    except RuntimeError as err:  # a worker process died without returning (killed, os._exit, ...)
        raise WorkerError(f"a worker process died: {err}") from None
    except Exception as err:
        if "Spark job has failed" not in str(err):
            raise
        raise LaunchError("the Spark job failed before training started (Spark's error is above); most "
                          "often the executors' Python cannot import horovod or hvdtrain: point "
                          "spark.pyspark.python (or PYSPARK_PYTHON) at the environment with hvdtrain[spark]") \
            from None
