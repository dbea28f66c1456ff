"""`compress(run_dir, method)`: read a finished run, compress its model, measure both, write a new run dir.

The flow: check every input (nothing is written until all checks pass), compress (prune's fine-tune
and distillation train on every Horovod worker with the normal Trainer), then rank 0 measures the
original and the compressed model side by side, exports the compressed one, loads the export back
to compare outputs, and writes the run directory. Every rank returns the same report.
"""
from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hvdtrain.compression import measure, report
from hvdtrain.compression.distill import DistillLoss, LabelAccuracy, check_student, soft_targets
from hvdtrain.compression.export import export_program, load_exported, max_difference, program_bytes, save_program
from hvdtrain.compression.options import TRAINED, CompressOptions
from hvdtrain.compression.prune import check_prunable, prune_channels
from hvdtrain.compression.quantize import quantize_int8
from hvdtrain.config.train_config import TrainConfig, load_config, to_yaml
from hvdtrain.data.datasets import Data, build_data
from hvdtrain.environment import process
from hvdtrain.errors import UserError
from hvdtrain.models.builtin import build_model
from hvdtrain.output.console import console
from hvdtrain.output.files import atomic_write, write_text

EXPORT_TOLERANCE = 1e-5                # max |exported - in-process| output difference accepted


@dataclass
class Source:
    """A finished run: its config, trained model, data (the same split) and model file size."""
    path: Path
    config: TrainConfig
    model: nn.Module
    data: Data
    input_shape: tuple[int, ...]
    model_bytes: int


@dataclass
class Outcome:
    """What a method produced: the compressed model, its config, and what goes into the report."""
    name: str
    model: nn.Module
    config: TrainConfig
    details: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    extra: list[tuple[str, nn.Module]] = field(default_factory=list)  # more rows (distill: the baseline)


def load_source(run_dir: str | Path) -> Source:
    """The trained model of `run_dir` (config.yaml + model.pt written by training), rebuilt and loaded.

    Raises:
        UserError: the directory, its config or its model is missing or does not match.
    """
    path = Path(run_dir)
    if not path.is_dir():
        raise UserError(f"run directory {path} does not exist")
    weights, config_file = path / "model.pt", path / "config.yaml"
    if not weights.is_file():
        raise UserError(f"{path} has no model.pt (a finished training run writes it); nothing to compress")
    if not config_file.is_file():
        raise UserError(f"{path} has no config.yaml to rebuild the model from")
    config = load_config(str(config_file))
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as err:
        raise UserError(f"cannot read {weights}: {str(err).strip().splitlines()[0][:160]}") from None
    data = build_data(config)
    input_shape = tuple(data.train[0][0].shape)
    model = build_model(config, input_shape, data.num_classes)
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as err:
        raise UserError(f"{weights} does not fit the model of {config_file} ({config.model}): "
                        f"{str(err).strip().splitlines()[0][:160]}") from None
    return Source(path, config, model.eval(), data, input_shape, weights.stat().st_size)


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


def train_config(config: TrainConfig, **changes: Any) -> TrainConfig:
    """The source run's config for a follow-up training that writes no run directory of its own."""
    plain = {"run_dir": "", "name": "", "resume": "", "monitor": "", "patience": 0, "elastic": False,
             "stages": 1, "stage_split": (), "micro_batches": 1}
    return load_config(**{**config.to_dict(), **plain, **changes})


def prepare(run_dir: str | Path, method: str = "int8", *, out: str = "", **options: Any) -> tuple[
        CompressOptions, Source, Path, tuple[nn.Module, TrainConfig] | None]:
    """Every check of `compress`, before anything is trained or written (the CLI runs it before launching).

    Returns:
        The options, the source run, the output directory to create, and the (student, config) for distill.
    Raises:
        UserError: an unknown method or option, a run without a model, an output that exists, a model prune
            cannot shrink, a student that does not fit the data.
    """
    try:
        opts = CompressOptions(method=method, out=out, **options)
    except TypeError as err:
        raise UserError(f"compress: {err}") from None
    source = load_source(run_dir)
    out_path = plan_out(source.path, opts.methods, opts.out)
    student = _student(source, opts) if "distill" in opts.methods else None
    if "prune" in opts.methods:
        check_prunable(source.model)
    return opts, source, out_path, student


def compress(run_dir: str | Path, method: str = "int8", *, out: str = "", **options: Any) -> dict[str, Any]:
    """Compress the model of a finished run into a new run directory, with a measured report.

    Args:
        run_dir: a training run directory (config.yaml, model.pt).
        method: int8, prune or distill; several comma-separated ("int8,prune") write one run directory
            each under `out` (default RUN_DIR-compressed) and a report comparing all of them.
        out: the new run directory; default RUN_DIR-METHOD.
        **options: any CompressOptions field, e.g. sparsity=0.5, student="mlp", student_hidden=16.
    Returns:
        The report (also in OUT/report.json): one row per model with params, bytes, latency_ms per batch
        size, val_acc; how latency was measured; the export check; notes on any fallback.
    Example:
        >>> report = hvdtrain.compress("runs/mlp-digits", "int8")
        >>> report["models"][1]["bytes"] / report["models"][0]["bytes"]
    Under `horovodrun -np N` every rank calls it; prune's fine-tune and distillation use all ranks.
    """
    opts, source, out_path, student = prepare(run_dir, method, out=out, **options)
    from hvdtrain.distributed import dist

    # Horovod: only training needs the workers; int8 alone starts Horovod only when a launcher started
    # several processes, so that they all return rank 0's report.
    trains = any(m in TRAINED for m in opts.methods)
    world = dist.init() if trains or process.current().size > 1 else None
    is_root = process.is_rank_zero()
    outcomes: list[tuple[str, Outcome]] = []
    for name in opts.methods:
        if name == "int8":
            if is_root:  # no training: the other ranks wait for the report
                outcomes.append((name, _int8(source, opts)))
        elif name == "prune":
            outcomes.append((name, _prune(source, opts)))
        else:
            assert student is not None
            outcomes.append((name, _distill(source, opts, *student)))
    result, error = None, None
    if is_root:
        try:
            result = _measure_and_write(source, opts, out_path, outcomes)
        except UserError as err:
            error = str(err)
    if world is not None:
        # Horovod: every rank returns rank 0's report (or raises its error) instead of hanging.
        result, error = dist.broadcast_object((result, error), name="compress_report")
    if error:
        raise UserError(error)
    assert result is not None
    return result


def _say(opts: CompressOptions, text: str) -> None:
    if opts.verbose and process.is_rank_zero():
        console.line(f"hvdtrain compress: {text}")


def _calibration(data: Data, count: int) -> torch.Tensor:
    count = min(count, len(data.train))
    return torch.stack([data.train[i][0] for i in range(count)])


def _int8(source: Source, opts: CompressOptions) -> Outcome:
    quantized = quantize_int8(source.model, opts.int8_mode, _calibration(source.data, opts.calibration))
    _say(opts, f"int8 {quantized.mode}: {len(quantized.int8_layers)} layer(s) in int8")
    details = {"int8_mode": quantized.mode, "asked_mode": opts.int8_mode, "int8_layers": quantized.int8_layers,
               "calibration_samples": min(opts.calibration, len(source.data.train)) if quantized.mode == "static"
               else 0}
    return Outcome(f"int8 ({quantized.mode})", quantized.model, source.config, details, quantized.notes)


def _prune(source: Source, opts: CompressOptions) -> Outcome:
    from hvdtrain.train.trainer import Trainer

    pruned, lines = prune_channels(source.model, opts.sparsity)
    before = measure.accuracy(pruned, source.data.val)
    epochs = opts.epochs or 3
    config = train_config(source.config, epochs=epochs, lr=opts.lr or source.config.lr, warmup_epochs=0)
    _say(opts, f"pruned {', '.join(lines)}; held-out accuracy before fine-tuning {before:.4f}; "
               f"fine-tuning {epochs} epoch(s)")
    history = Trainer(pruned, source.data.train, source.data.val, config=config).fit()
    details = {"sparsity": opts.sparsity, "pruned_layers": lines, "val_acc_before_finetune": before,
               "finetune": {"epochs": epochs, "lr": config.lr, "workers": history.summary.get("workers"),
                            "val_acc": [r.get("val_acc") for r in history],
                            "wall_time_s": history.summary.get("wall_time_s")}}
    return Outcome(f"pruned {opts.sparsity:.0%}", pruned.eval(), source.config, details)


def _student(source: Source, opts: CompressOptions) -> tuple[nn.Module, TrainConfig]:
    """The student, built with the seed of the run, checked against the data before anything trains."""
    config = train_config(source.config, model=opts.student, hidden=opts.student_hidden,
                          epochs=opts.epochs or source.config.epochs, lr=opts.lr or source.config.lr)
    torch.manual_seed(config.seed)
    try:
        student = build_model(config, source.input_shape, source.data.num_classes)
    except UserError as err:  # a plug-in that cannot be imported, a cnn for flat inputs, ...
        raise UserError(f"student {opts.student}: {err}") from None
    except Exception as err:
        raise UserError(f"student {opts.student} cannot be built for inputs {source.input_shape}: "
                        f"{type(err).__name__}: {str(err)[:160]}") from None
    check_student(student, source.data.train[0][0], source.data.num_classes, opts.student)
    return student, config


def _distill(source: Source, opts: CompressOptions, student: nn.Module, config: TrainConfig) -> Outcome:
    from hvdtrain.train.trainer import Trainer

    initial = copy.deepcopy(student.state_dict())  # the baseline starts from the same weights
    targets = soft_targets(source.model, source.data.train)
    loss = DistillLoss(opts.temperature, opts.alpha)
    _say(opts, f"distilling into {opts.student} (hidden {opts.student_hidden}, "
               f"{measure.count_params(student):,} parameters) for {config.epochs} epoch(s)")
    # The teacher's logits ride in the targets, so the Trainer's own accuracy would not recognise the labels.
    distilled = Trainer(student, targets, source.data.val, loss_fn=loss, metrics=[LabelAccuracy()],
                        config=config).fit()
    details: dict[str, Any] = {
        "student": opts.student, "student_hidden": opts.student_hidden, "temperature": opts.temperature,
        "alpha": opts.alpha, "epochs": config.epochs, "lr": config.lr, "workers": distilled.summary.get("workers"),
        "distilled_val_acc": [r.get("val_acc") for r in distilled]}
    outcome = Outcome("student (distilled)", student.eval(), config, details)
    if opts.baseline:
        _say(opts, "training the same student without the teacher (same epochs, LR, seed)")
        plain = copy.deepcopy(student)
        plain.load_state_dict(initial)
        baseline = Trainer(plain, source.data.train, source.data.val, config=config).fit()
        details["baseline_val_acc"] = [r.get("val_acc") for r in baseline]
        outcome.extra.append(("student (no teacher)", plain.eval()))
    return outcome


def _row(name: str, model: Any, source: Source, opts: CompressOptions, file_bytes: int,
         example: torch.Tensor) -> dict[str, Any]:
    try:
        export_bytes: int | None = program_bytes(export_program(model, example))
    except Exception:
        export_bytes = None
    row: dict[str, Any] = {
        "name": name, "params": measure.count_params(model), "bytes": file_bytes,
        "export_bytes": export_bytes if export_bytes is not None else -1,
        "latency_ms": {str(b): measure.latency_ms(model, source.input_shape, b, threads=opts.threads,
                                                  repeats=opts.repeats) for b in opts.batch_sizes},
        "val_acc": measure.accuracy(model, source.data.val)}
    if opts.compiled:
        try:
            row["compiled_latency_ms"], row["compile_s"] = measure.compiled_latency_ms(
                model, source.input_shape, opts.batch_sizes, threads=opts.threads, repeats=opts.repeats)
        except Exception as err:  # no C++ compiler, an op inductor cannot lower, ...
            row["compiled_latency_ms"], row["compile_s"] = None, None
            row["compile_error"] = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:160]}"
    return row


def _export(outcome: Outcome, out: Path, val_inputs: torch.Tensor) -> dict[str, Any]:
    """Export the compressed model to out/model.pt2, load it back, compare outputs; write its weights, config."""
    example = val_inputs[:8].clone()  # a view would store all of val_inputs in the .pt2 as its sample input
    try:
        program = export_program(outcome.model, example)
    except Exception as err:
        raise UserError(f"the compressed model could not be exported with torch.export: {type(err).__name__}: "
                        f"{str(err).strip().splitlines()[0][:200]}") from None
    out.mkdir(parents=True, exist_ok=True)
    save_program(program, out / "model.pt2")
    difference = max_difference(load_exported(out / "model.pt2"), outcome.model, val_inputs)
    atomic_write(out / "compressed.pt", lambda handle: torch.save(outcome.model.state_dict(), handle))
    write_text(out / "config.yaml", to_yaml(outcome.config))
    return {"file": "model.pt2", "format": "torch.export ExportedProgram (dynamic batch)",
            "load": "torch.export.load('model.pt2').module()", "max_abs_diff": difference,
            "tolerance": EXPORT_TOLERANCE, "ok": difference <= EXPORT_TOLERANCE,
            "compared_on": f"{len(val_inputs)} held-out samples"}


def _report(opts: CompressOptions, source: Source, method: str, out: Path, rows: list[dict[str, Any]],
            details: dict[str, Any], notes: list[str], export: dict[str, Any]) -> dict[str, Any]:
    original, compressed = rows[0], rows[1]
    return {
        "format": report.FORMAT, "method": method, "source": str(source.path), "out": str(out),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "torch": torch.__version__,
        "options": {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(opts).items()},
        "details": details, "notes": notes,
        "latency": {"threads": opts.threads, "repeats": opts.repeats, "batch_sizes": list(opts.batch_sizes),
                    "statistic": "median", "mode": "eager PyTorch, in-process models, random inputs",
                    "compiled": "torch.compile, inductor with freezing, one graph per batch size" if opts.compiled
                    else "not measured (--compile)"},
        "models": rows,
        "ratios": {"params": original["params"] / compressed["params"],
                   "bytes": original["bytes"] / compressed["bytes"],
                   **{f"latency_batch{b}": original["latency_ms"][str(b)] / compressed["latency_ms"][str(b)]
                      for b in opts.batch_sizes},
                   "val_acc_change": compressed["val_acc"] - original["val_acc"]},
        "export": export, "export_ok": export["ok"],
        "files": {"model.pt2": "the compressed model (torch.export)", "compressed.pt": "its state_dict",
                  "config.yaml": "data and (for distill) the student's config"},
    }


def _compiled_note(original: dict[str, Any], compressed: dict[str, Any], sizes: tuple[int, ...]) -> list[str]:
    """Where torch.compile turns the comparison around, say so, with the eager original beside it."""
    before, after = original.get("compiled_latency_ms"), compressed.get("compiled_latency_ms")
    if not before or not after:
        return []
    faster = [f"batch {b}: {after[str(b)]:.3f} ms compiled vs the original's {before[str(b)]:.3f} compiled, "
              f"{original['latency_ms'][str(b)]:.3f} eager" for b in sizes if after[str(b)] < before[str(b)]]
    return [f"after torch.compile the compressed model is faster than the compiled original at {'; '.join(faster)}"
            ] if faster else []


def _measure_and_write(source: Source, opts: CompressOptions, out: Path,
                       outcomes: list[tuple[str, Outcome]]) -> dict[str, Any]:
    """Rank 0: export and check each compressed model, measure all models together, write the run directories."""
    val_inputs = torch.stack([source.data.val[i][0] for i in range(len(source.data.val))])
    example = val_inputs[:8].clone()
    several = len(outcomes) > 1
    dirs = {method: out / method if several else out for method, _ in outcomes}
    exports = {method: _export(outcome, dirs[method], val_inputs) for method, outcome in outcomes}
    count = 1 + sum(1 + len(outcome.extra) for _, outcome in outcomes)
    _say(opts, f"measuring {count} models ({opts.repeats} runs per batch size, {opts.threads} thread(s))")
    original = _row("original", source.model, source, opts, source.model_bytes, example)
    reports = []
    for method, outcome in outcomes:
        rows = [original, _row(outcome.name, outcome.model, source, opts,
                               (dirs[method] / "compressed.pt").stat().st_size, example)]
        for name, model in outcome.extra:
            rows.append(_row(name, model, source, opts, measure.saved_bytes(model.state_dict()), example))
        outcome.notes.extend(f"torch.compile failed for {row['name']}: {row['compile_error']}"
                             for row in rows if row.get("compile_error"))
        slower = [str(b) for b in opts.batch_sizes if rows[1]["latency_ms"][str(b)] > original["latency_ms"][str(b)]]
        if slower and method == "int8":
            outcome.notes.append(f"int8 is slower than float32 here at batch {', '.join(slower)}: for layers this "
                                 "small the per-call cost of quantizing activations and dispatching int8 tensors "
                                 "outweighs the cheaper matmuls; the gain is size (bytes), and speed needs larger "
                                 "layers or torch.compile")
        outcome.notes.extend(_compiled_note(original, rows[1], opts.batch_sizes))
        reports.append(_report(opts, source, method, dirs[method], rows, outcome.details, outcome.notes,
                               exports[method]))
        report.write(dirs[method], reports[-1])
    result = reports[0]
    if several:
        result = {**reports[0], "method": opts.method, "out": str(out),
                  "runs": {method: str(dirs[method]) for method, _ in outcomes},
                  "details": {r["method"]: r["details"] for r in reports},
                  "notes": [f"{r['method']}: {note}" for r in reports for note in r["notes"]],
                  "models": [original, *(row for r in reports for row in r["models"][1:])],
                  "ratios": {r["method"]: r["ratios"] for r in reports},
                  "export": {r["method"]: r["export"] for r in reports},
                  "export_ok": all(r["export"]["ok"] for r in reports),
                  "files": {f"{method}/": "a compressed run directory" for method, _ in outcomes}}
        report.write(out, result)
    if opts.verbose:
        console.line(report.table(result))
        written = ", ".join(f"{m}/" for m, _ in outcomes) if several else "model.pt2"
        console.line(f"hvdtrain compress: wrote {out} ({written}, report.json, report.txt, report.png)")
    return result
