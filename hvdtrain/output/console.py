"""Rank 0's console: whole lines, one write each, through the `hvdtrain` logger.

Under `mpirun --tag-output` every chunk of output is tagged, not every line, so a line is written in
one call and flushed; a carriage-return progress bar appears only where someone watches (a terminal
of the user's own or a notebook, never under a launcher) unless asked for. Users can silence or
redirect everything with `logging.getLogger("hvdtrain")`. Errors go to stderr from any rank.
"""
from __future__ import annotations

import logging
import sys
from typing import Any

from hvdtrain.environment import process

LOGGER = logging.getLogger("hvdtrain")
TAIL_COLUMNS = (("lr", "lr"), ("samples/s", "samples_per_s"), ("step_ms", "step_time_s"),
                ("time_s", "epoch_time_s"))


class _StdoutHandler(logging.Handler):
    """Writes each record as one line to the *current* sys.stdout (a notebook or pytest may swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stdout.write(self.format(record) + "\n")
            sys.stdout.flush()
        except Exception:  # a closed stream must not crash training
            self.handleError(record)


if not LOGGER.handlers:
    LOGGER.addHandler(_StdoutHandler())
    LOGGER.setLevel(logging.INFO)
    LOGGER.propagate = False


def bar_wanted(choice: str, *, tty: bool, notebook: bool, launched: bool) -> bool:
    """progress_bar auto: a bar in a terminal or notebook of the user's own, never under a launcher."""
    if choice in ("on", "off"):
        return choice == "on"
    return (tty or notebook) and not launched


class Console:
    """What the user reads. Quiet on ranks other than 0 (errors excepted)."""

    def __init__(self) -> None:
        self.bar: Any = None
        self._notices: set[str] = set()

    @property
    def rank0(self) -> bool:
        # Asked each time: Horovod's rank once it runs (rank 0 may move after an elastic reset), the launcher's before.
        return process.is_rank_zero()

    def line(self, text: str) -> None:
        if not self.rank0:
            return
        if self.bar is not None:
            self.bar.write(text)  # above the bar, not through it
        else:
            LOGGER.info(text)

    def notice(self, key: str, text: str) -> None:
        """Say `text` once per process (e.g. a missing optional package)."""
        if key not in self._notices:
            self._notices.add(key)
            self.line(f"hvdtrain: note: {text}")

    def error(self, text: str) -> None:
        """Any rank, to stderr, one line: `hvdtrain: TEXT`."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        sys.stderr.write(f"hvdtrain: {text}\n")
        sys.stderr.flush()

    # ---- the progress bar (rank 0 only)
    def open_bar(self, choice: str, total: int, initial: int, unit: str = "step") -> None:
        notebook = "ipykernel" in sys.modules
        if not self.rank0 or not bar_wanted(choice, tty=sys.stderr.isatty(), notebook=notebook,
                                            launched=process.launched()):
            return
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, initial=initial, unit=unit, leave=False)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update()

    def advance_postfix(self, loss: float | None) -> None:
        if self.bar is not None and loss is not None:
            self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)

    def close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    # ---- what the trainer shows
    def done(self, summary: dict[str, Any]) -> None:
        """The run's last lines: the best epoch (with --monitor) and the summary."""
        run = summary.get("run_dir")
        if summary.get("monitor") and summary["best_epoch"] >= 0:
            how = "stopped early; " if summary["stopped_early"] else ""
            self.line(f"hvdtrain: {how}best {summary['monitor']} {summary['best']:.4f} at epoch "
                      f"{summary['best_epoch'] + 1}" + (f" -> {run}/best.pt" if run else ""))
        metrics = "  ".join(f"{k} {v:.4f}" for k, v in summary.items() if k.startswith("val_") and k != "val_samples"
                            and isinstance(v, float))
        self.line(f"hvdtrain: done  {summary['workers']} worker(s)  {summary['epochs_run']} epochs  "
                  f"{summary['steps']} steps  {metrics}  {summary['samples_per_s']:.0f} samples/s  "
                  f"wall {summary['wall_time_s']:.1f} s" + (f"  -> {run}" if run else ""))

    def banner(self, lines: list[str]) -> None:
        for text in lines[:3]:
            self.line(f"hvdtrain: {text}")

    def epoch_row(self, record: dict[str, Any], header: bool) -> None:
        """One aligned table row per epoch (the header before the first); metric columns follow the record."""
        def metrics(prefix: str) -> list[tuple[str, str]]:
            return [(key.removeprefix("train_"), key) for key, value in record.items() if key.startswith(prefix)
                    and key != f"{prefix}loss" and not key.endswith("_samples") and isinstance(value, (int, float))]

        columns = [("epoch", "epoch"), ("step", "step"), ("loss", "train_loss"), *metrics("train_"),
                   ("val_loss", "val_loss"), *metrics("val_"), *TAIL_COLUMNS]
        widths = [max(9, len(name)) for name, _ in columns]
        if header:
            self.line("  ".join(f"{name:>{w}}" for (name, _), w in zip(columns, widths, strict=True)))
        self.line("  ".join(f"{_cell(key, record.get(key)):>{w}}" for (_, key), w in zip(columns, widths, strict=True)))

def banner_lines(config: Any, *, world: Any, backend: str, device: str, train: int, held_out: int,
                 lr_scale: float, run_path: str | None) -> list[str]:
    """The three lines a run starts with: who trains on what, what differs from the defaults, where it goes."""
    changed = config.changed()
    keys = " ".join(f"{k}={v}" for k, v in changed.items()) if changed else "all defaults"
    return [f"{world.size} worker(s) ({backend}, {device}), {train} train / {held_out} held-out samples, batch "
            f"{config.batch_size}/worker, LR x{lr_scale:g} ({config.lr_scaling})",
            f"config: {keys}" + (f"; full config in {run_path}/config.yaml" if run_path else ""),
            f"run dir {run_path}" if run_path else "no run dir (run_dir '')"]


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key == "epoch":
        return str(value + 1)
    if key == "step":
        return str(value)
    if key == "lr":
        return f"{value:.4g}"
    if key == "samples_per_s":
        return f"{value:.0f}"
    if key == "step_time_s":
        return f"{value * 1000:.1f}"
    if key == "epoch_time_s":
        return f"{value:.2f}"
    return f"{value:.4f}"


console = Console()
