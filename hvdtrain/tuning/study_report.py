"""What a study shows and leaves behind: a line per trial, the results table, best.yaml and two plots.

Everything here runs on one process only (the tune process, or rank 0 of an inprocess job): whole lines,
one write each, and a tqdm bar over trials only in a terminal of the user's own.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from hvdtrain.config.train_config import to_yaml
from hvdtrain.output.console import console
from hvdtrain.output.files import write_text
from hvdtrain.tuning.tune_settings import TuneSettings


def say(text: str) -> None:
    """One whole line, through the console layer (above the bar when there is one)."""
    console.line(text)


class Progress:
    """A line per finished trial; a bar over the study's trials only where someone watches."""

    def __init__(self, settings: TuneSettings, finished: int, *, enabled: bool = True) -> None:
        self.settings = settings
        self.enabled = enabled
        if enabled:
            console.open_bar("auto", settings.trials, min(finished, settings.trials), unit="trial")

    def line(self, text: str) -> None:
        if self.enabled:
            say(text)

    def trial_done(self, study: Any, frozen: Any) -> None:
        if not self.enabled:
            return
        self.line(trial_line(frozen, self.settings, study.finished()))
        if frozen.state.name in ("COMPLETE", "PRUNED"):
            console.advance()

    def close(self) -> None:
        if self.enabled:
            console.close_bar()


def announce(study: Any, progress: Progress) -> None:
    """What this invocation will do: the study resumed (if it was), the trials left, how they run."""
    settings, done = study.settings, study.finished()
    if done or study.recovered:
        again = f"; {len(study.recovered)} interrupted trial(s) marked failed and queued again" \
            if study.recovered else ""
        progress.line(f"tune: resuming study '{settings.study}' in {settings.dir}: {done} of {settings.trials} "
                      f"trials finished{again}")
    how = (f"{settings.np} workers per trial, {settings.parallel} at a time" if settings.mode == "job"
           else "inside this Horovod job")
    progress.line(f"tune: {study.remaining()} trial(s) to run, {how}; {settings.sampler} sampler, "
                  f"{settings.pruner} pruner on {settings.metric}")


def _params(params: dict[str, Any]) -> str:
    return " ".join(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}"
                    for key, value in params.items())


def trial_line(frozen: Any, settings: TuneSettings, finished: int) -> str:
    """`tune: trial 3 [4/6] complete  val_acc 0.9610  lr=0.08 batch_size=32  2 workers, LR x2 (linear)  19.2 s`."""
    attrs, state = frozen.user_attrs, frozen.state.name.lower()
    head = f"tune: trial {frozen.number} [{finished}/{settings.trials}]"
    world = (f"  {attrs['world_size']} workers, LR x{attrs['lr_scale']:g} ({attrs['lr_scaling']})"
             if "world_size" in attrs else "")
    took = f"  {attrs['duration_s']:.1f} s" if "duration_s" in attrs else ""
    if state == "fail":
        return f"{head} failed  {_params(frozen.params)}{world}{took}: {attrs.get('error', 'unknown error')}"
    epochs = sorted(frozen.intermediate_values)
    if state == "pruned":
        last = frozen.intermediate_values[epochs[-1]] if epochs else None
        value = f"{settings.metric} {last:.4f}" if last is not None else "no epoch finished"
        verdict = f"pruned after epoch {epochs[-1] + 1 if epochs else 0}"
    else:
        value, verdict = f"{settings.metric} {frozen.value:.4f}", f"complete ({len(epochs)} epochs)"
    return f"{head} {verdict}  {value}  {_params(frozen.params)}{world}{took}"


def results_table(trials: list[Any], settings: TuneSettings) -> str:
    """One row per trial of the study, best first among the complete ones."""
    keys = sorted({key for t in trials for key in t.params})
    header = ["trial", "state", settings.metric, "epochs", *keys, "workers", "time_s", "note"]
    reverse = settings.direction == "maximize"
    done = sorted((t for t in trials if t.state.name == "COMPLETE"), key=lambda t: t.value, reverse=reverse)
    rest = sorted((t for t in trials if t.state.name != "COMPLETE"), key=lambda t: t.number)
    rows = [header]
    for t in [*done, *rest]:
        last = t.intermediate_values[max(t.intermediate_values)] if t.intermediate_values else None
        value = t.value if t.value is not None else last if t.state.name == "PRUNED" else None
        rows.append([str(t.number), t.state.name.lower(), "-" if value is None else f"{value:.4f}",
                     str(len(t.intermediate_values)),
                     *(_cell(t.params.get(key)) for key in keys),
                     str(t.user_attrs.get("world_size", "-")),
                     f"{t.user_attrs['duration_s']:.1f}" if "duration_s" in t.user_attrs else "-",
                     _note(t)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    return "\n".join("  ".join([*(cell.rjust(width) for cell, width in zip(row, widths, strict=False)), row[-1]])
                     .rstrip() for row in rows)


def _note(trial: Any) -> str:
    attrs = trial.user_attrs
    if trial.state.name == "FAIL":
        return str(attrs.get("error", ""))[:100]
    if "pruned_at_epoch" in attrs:
        return f"pruned after epoch {attrs['pruned_at_epoch'] + 1}"
    return f"retry of trial {attrs['retry_of']}" if "retry_of" in attrs else ""


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def write_best(study: Any, settings: TuneSettings, run_dir: str) -> Path | None:
    """TUNE_DIR/best.yaml: the best trial's full resolved config (seed included), ready for `--config`.

    The trial's own config.yaml is the source, so what was trained is what is reproduced; only where it
    writes changes (run_dir from the base config, a fresh name). A comment says on how many workers it ran:
    the LR scaling rule makes the result depend on it.
    """
    complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    if not complete:
        return None
    from hvdtrain.trained import finished_run

    best = study.best_trial
    config = finished_run.read_config(best.user_attrs["run_dir"], run_dir=run_dir, name="", resume="")
    workers = best.user_attrs.get("world_size", 1)
    file = Path(settings.dir) / "best.yaml"
    header = (f"# hvdtrain tune: best of study '{settings.study}' in {settings.dir} (trial {best.number}, "
              f"{len(complete)} complete): {settings.metric} {best.value:.4f}\n"
              f"# trained on {workers} worker(s), LR x{best.user_attrs.get('lr_scale', 1):g} "
              f"({config.lr_scaling} scaling); reproduce with:\n"
              f"#   horovodrun -np {workers} -H localhost:{workers} {_program(best.user_attrs, file)}\n")
    return write_text(Path(settings.dir) / "best.yaml", header + to_yaml(config))


def _program(attrs: dict[str, Any], file: Path) -> str:
    """The worker program that trains best.yaml again: hvdtrain's own, or the study's train_fn's."""
    train_fn = str(attrs.get("train_fn", ""))
    if not train_fn:
        return f"python -m hvdtrain --config {file}"
    if ":" in train_fn:   # importable: the program job-mode trials ran
        return f"python -m hvdtrain.tuning.trial_worker --train-fn {train_fn} --config {file}"
    return f"python SCRIPT, where SCRIPT fits the Trainer that {train_fn}(hvdtrain.load_config('{file}')) returns"


def write_plots(study: Any, settings: TuneSettings) -> tuple[list[Path], list[str]]:
    """history.png (metric per trial, best so far) and importance.png (needs >= 2 complete trials).

    Returns:
        (files written, notes on what was not drawn and why).
    """
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, safe in any process

    folder, notes, written = Path(settings.dir), [], []
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    if complete:
        ax.scatter([t.number for t in complete], [t.value for t in complete], label="complete")
        better = max if settings.direction == "maximize" else min
        best, line = None, []
        for t in complete:
            best = t.value if best is None else better(best, t.value)
            line.append(best)
        ax.step([t.number for t in complete], line, where="post", color="C1", label="best so far")
    pruned = [t for t in trials if t.state.name == "PRUNED" and t.intermediate_values]
    if pruned:
        ax.scatter([t.number for t in pruned], [t.intermediate_values[max(t.intermediate_values)] for t in pruned],
                   marker="x", color="C3", label="pruned (last epoch seen)")
    ax.set(xlabel="trial", ylabel=settings.metric, title="optimization history")
    if complete or pruned:   # nothing to label when every trial failed
        ax.legend(loc="best")
    fig.savefig(folder / "history.png", dpi=80)
    written.append(folder / "history.png")
    if len(complete) < 2:
        notes.append(f"parameter importance needs >= 2 complete trials (have {len(complete)}): no importance.png")
        return written, notes
    try:
        import optuna

        with warnings.catch_warnings(record=True) as said:   # Optuna's own warnings: a note, not a traceback line
            warnings.simplefilter("always")
            importance = optuna.importance.get_param_importances(study)
    except (ValueError, RuntimeError) as err:
        notes.append(f"parameter importance could not be computed ({err}): no importance.png")
        return written, notes
    notes.extend(f"parameter importance: {warning.message}" for warning in said)
    fig = Figure(figsize=(6, 1.5 + 0.4 * len(importance)))
    ax = fig.add_subplot()
    names = list(importance)[::-1]
    ax.barh(names, [importance[name] for name in names])
    ax.set(xlabel=f"importance for {settings.metric} (fANOVA)", title="parameter importance")
    fig.tight_layout()
    fig.savefig(folder / "importance.png", dpi=80)
    written.append(folder / "importance.png")
    return written, notes

