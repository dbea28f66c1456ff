"""`compress(run_dir, method)`: read a finished run, compress its model, measure both, write a new run dir.

The flow: check every input (nothing is written until all checks pass), run each method (its module
owns its work: prune's fine-tune and distillation train on every Horovod worker with the normal
Trainer), then rank 0 measures the original and the compressed models side by side, exports them,
loads each export back to compare outputs, and writes the run directories (`results`). Every rank
returns the same report.
"""
from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

from torch import nn

from hvdtrain.compression import distill, prune, quantize, tracked
from hvdtrain.compression.compress_options import TRAINED, CompressOptions
from hvdtrain.compression.outcome import Outcome
from hvdtrain.compression.results import measure_and_write
from hvdtrain.config.train_config import TrainConfig
from hvdtrain.environment import process
from hvdtrain.errors import UserError
from hvdtrain.trained import finished_run
from hvdtrain.trained.finished_run import FinishedRun


def plan_out(source: Path, methods: tuple[str, ...], out: str) -> Path:
    """The new run directory: `out`, or RUN_DIR-METHOD beside the source (RUN_DIR-compressed, with one
    subdirectory per method, for several methods); it must be new or empty."""
    suffix = methods[0] if len(methods) == 1 else "compressed"
    path = Path(out) if out else source.with_name(f"{source.name}-{suffix}")
    if path.resolve() == source.resolve():
        raise UserError(f"--out {path} is the source run itself; pick a new directory")
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UserError(f"output directory {path} already exists and is not empty; pass a new --out")
    return path


def prepare(run_dir: str | Path, method: str = "int8", *, out: str = "", **options: Any) -> tuple[
        CompressOptions, FinishedRun, Path, tuple[nn.Module, TrainConfig] | None]:
    """Every check of `compress`, before anything is trained or written (the CLI runs it before launching).

    Returns:
        The options, the source run, the output directory to create, and the (student, config) for distill.
    Raises:
        UserError: an unknown method or option, a run without a model or whose model cannot be rebuilt, an
            output that exists, a model prune cannot shrink, a student that does not fit the data.
    """
    try:
        opts = CompressOptions(method=method, out=out, **options)
    except TypeError as err:
        raise UserError(f"compress: {err}") from None
    # A builder named with --model replaces the run's model.json (or config.yaml's model).
    run = finished_run.read(run_dir, **({"model": opts.model} if opts.model else {}))
    out_path = plan_out(run.path, opts.methods, opts.out)
    student = distill.student(run, opts) if "distill" in opts.methods else None
    if "prune" in opts.methods:
        prune.check_prunable(run.model)
    return opts, run, out_path, student


def compress(run_dir: str | Path, method: str = "int8", *, out: str = "", **options: Any) -> dict[str, Any]:
    """Compress the model of a finished run into a new run directory, with a measured report.

    Args:
        run_dir: a training run directory (config.yaml, model.pt).
        method: int8, prune or distill; several comma-separated ("int8,prune") write one run directory
            each under `out` (default RUN_DIR-compressed) and a report comparing all of them.
        out: the new run directory; default RUN_DIR-METHOD.
        **options: any CompressOptions field, e.g. sparsity=0.5, student="mlp", student_hidden=16, or
            model="module:function" for a run of a model that its model.json says cannot be rebuilt.
    Returns:
        The report (also in OUT/report.json): one row per model with params, bytes, latency_ms per batch
        size, val_acc; how latency was measured; the export check; notes on any fallback.
    Example:
        >>> report = hvdtrain.compress("runs/mlp-digits", "int8")
        >>> report["models"][1]["bytes"] / report["models"][0]["bytes"]
    Under `horovodrun -np N` every rank calls it; prune's fine-tune and distillation use all ranks.
    """
    opts, run, out_path, student = prepare(run_dir, method, out=out, **options)
    from hvdtrain.distributed import collectives, runtime

    # Horovod: only training needs the workers; int8 alone starts Horovod only when a launcher started
    # several processes, so that they all return rank 0's report.
    trains = any(m in TRAINED for m in opts.methods)
    # An in-process run gives the caller's os.environ back when it ends (runtime.started).
    horovod = runtime.started() if trains or process.current().size > 1 else nullcontext(None)
    with horovod as world:
        is_root = process.is_rank_zero()
        outcomes: list[tuple[str, Outcome]] = []
        for name in opts.methods:
            if name == "int8":
                if is_root:  # no training: the other ranks wait for the report
                    outcomes.append((name, quantize.compress(run, opts)))
            elif name == "prune":
                outcomes.append((name, prune.compress(run, opts)))
            else:
                assert student is not None
                outcomes.append((name, distill.compress(run, opts, *student)))
        result, error = None, None
        if is_root:
            try:
                result = measure_and_write(run, opts, out_path, outcomes)
                tracked.log(run, opts, out_path, result)  # its failures are one warning, never the report's
            except UserError as err:
                error = str(err)
        if world is not None:
            # Horovod: every rank returns rank 0's report (or raises its error) instead of hanging.
            result, error = collectives.broadcast_object((result, error), name="compress_report")
    if error:
        raise UserError(error)
    assert result is not None
    return result
