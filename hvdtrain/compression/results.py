"""Rank 0's part of `compress`: export and check each compressed model, measure every model side by side,
write one run directory per method (and a comparison for several), and build the report."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

from hvdtrain.compression import comparison_report as report
from hvdtrain.compression import measure
from hvdtrain.compression.compress_options import CompressOptions
from hvdtrain.compression.export import export_program, load_exported, max_difference, program_bytes, save_program
from hvdtrain.compression.outcome import Outcome, say
from hvdtrain.config.train_config import to_yaml
from hvdtrain.errors import UserError, first_line
from hvdtrain.output.console import console
from hvdtrain.output.files import atomic_write, write_text
from hvdtrain.trained.finished_run import FinishedRun

EXPORT_TOLERANCE = 1e-5                # max |exported - in-process| output difference accepted


def _row(name: str, model: Any, run: FinishedRun, opts: CompressOptions, file_bytes: int,
         example: torch.Tensor) -> dict[str, Any]:
    try:
        export_bytes: int | None = program_bytes(export_program(model, example))
    except Exception:
        export_bytes = None
    row: dict[str, Any] = {
        "name": name, "params": measure.count_params(model), "bytes": file_bytes,
        "export_bytes": export_bytes if export_bytes is not None else -1,
        "latency_ms": {str(b): measure.latency_ms(model, run.input_shape, b, threads=opts.threads,
                                                  repeats=opts.repeats) for b in opts.batch_sizes},
        "val_acc": measure.accuracy(model, run.data.val)}
    if opts.compiled:
        try:
            row["compiled_latency_ms"], row["compile_s"] = measure.compiled_latency_ms(
                model, run.input_shape, opts.batch_sizes, threads=opts.threads, repeats=opts.repeats)
        except Exception as err:  # no C++ compiler, an op inductor cannot lower, ...
            row["compiled_latency_ms"], row["compile_s"] = None, None
            row["compile_error"] = f"{type(err).__name__}: {first_line(err, 160)}"
    return row


def _export(outcome: Outcome, out: Path, val_inputs: torch.Tensor) -> dict[str, Any]:
    """Export the compressed model to out/model.pt2, load it back, compare outputs; write its weights, config."""
    example = val_inputs[:8].clone()  # a view would store all of val_inputs in the .pt2 as its sample input
    try:
        program = export_program(outcome.model, example)
    except Exception as err:
        raise UserError(f"the compressed model could not be exported with torch.export: {type(err).__name__}: "
                        f"{first_line(err)}") from None
    out.mkdir(parents=True, exist_ok=True)
    save_program(program, out / "model.pt2")
    difference = max_difference(load_exported(out / "model.pt2"), outcome.model, val_inputs)
    atomic_write(out / "compressed.pt", lambda handle: torch.save(outcome.model.state_dict(), handle))
    write_text(out / "config.yaml", to_yaml(outcome.config))
    return {"file": "model.pt2", "format": "torch.export ExportedProgram (dynamic batch)",
            "load": "torch.export.load('model.pt2').module()", "max_abs_diff": difference,
            "tolerance": EXPORT_TOLERANCE, "ok": difference <= EXPORT_TOLERANCE,
            "compared_on": f"{len(val_inputs)} held-out samples"}


def _report(opts: CompressOptions, run: FinishedRun, method: str, out: Path, rows: list[dict[str, Any]],
            details: dict[str, Any], notes: list[str], export: dict[str, Any]) -> dict[str, Any]:
    original, compressed = rows[0], rows[1]
    return {
        "format": report.FORMAT, "method": method, "source": str(run.path), "out": str(out),
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


def measure_and_write(run: FinishedRun, opts: CompressOptions, out: Path,
                       outcomes: list[tuple[str, Outcome]]) -> dict[str, Any]:
    """Rank 0: export and check each compressed model, measure all models together, write the run directories."""
    val_inputs = torch.stack([run.data.val[i][0] for i in range(len(run.data.val))])
    example = val_inputs[:8].clone()
    several = len(outcomes) > 1
    dirs = {method: out / method if several else out for method, _ in outcomes}
    exports = {method: _export(outcome, dirs[method], val_inputs) for method, outcome in outcomes}
    count = 1 + sum(1 + len(outcome.extra) for _, outcome in outcomes)
    say(opts, f"measuring {count} models ({opts.repeats} runs per batch size, {opts.threads} thread(s))")
    original = _row("original", run.model, run, opts, run.model_bytes, example)
    reports = []
    for method, outcome in outcomes:
        rows = [original, _row(outcome.name, outcome.model, run, opts,
                               (dirs[method] / "compressed.pt").stat().st_size, example)]
        for name, model in outcome.extra:
            rows.append(_row(name, model, run, opts, measure.saved_bytes(model.state_dict()), example))
        outcome.notes.extend(f"torch.compile failed for {row['name']}: {row['compile_error']}"
                             for row in rows if row.get("compile_error"))
        slower = [str(b) for b in opts.batch_sizes if rows[1]["latency_ms"][str(b)] > original["latency_ms"][str(b)]]
        if slower and method == "int8":
            outcome.notes.append(f"int8 is slower than float32 here at batch {', '.join(slower)}: for layers this "
                                 "small the per-call cost of quantizing activations and dispatching int8 tensors "
                                 "outweighs the cheaper matmuls; the gain is size (bytes), and speed needs larger "
                                 "layers or torch.compile")
        outcome.notes.extend(_compiled_note(original, rows[1], opts.batch_sizes))
        reports.append(_report(opts, run, method, dirs[method], rows, outcome.details, outcome.notes,
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
