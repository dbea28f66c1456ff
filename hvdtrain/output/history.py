"""Per-epoch metrics of a run, with a plot of the curves."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


class History(list):
    """A list of per-epoch metric dicts (`history[-1]["val_acc"]`), plus the run's summary.

    Example:
        >>> history = hvdtrain.fit(hvdtrain.load_config(epochs=3))
        >>> history[-1]["val_acc"], history.summary["samples_per_s"]
        >>> history.plot()
    """

    def __init__(self, epochs: list[dict[str, Any]] | None = None, summary: dict[str, Any] | None = None):
        super().__init__(epochs or [])
        self.summary: dict[str, Any] = summary or {}

    def series(self, key: str) -> list[float]:
        return [record[key] for record in self if record.get(key) is not None]

    def table(self) -> str:
        """The per-epoch metrics as an aligned text table."""
        keys = [k for k in ("epoch", "train_loss", "train_acc", "val_loss", "val_acc", "lr", "samples_per_s")
                if any(record.get(k) is not None for record in self)]
        rows = [keys] + [[_fmt(record[k] + 1 if k == "epoch" else record.get(k)) for k in keys]
                         for record in self]
        widths = [max(len(row[i]) for row in rows) for i in range(len(keys))]
        return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)

    def plot(self, path: str | Path | None = None) -> Any:
        """Draw loss and accuracy curves.

        Args:
            path: if given, also save the figure there as a PNG.
        Returns:
            The matplotlib Figure (shown inline in a notebook).
        """
        # Saved outside a notebook (the run's curves.png): a bare Figure, drawn by Agg, without pyplot, so the
        # caller's matplotlib backend is left as it was (and pyplot's import, ~0.3 s, is not paid at every run's end).
        detached = path is not None and not _in_notebook()
        if detached:
            from matplotlib.figure import Figure

            fig = Figure(figsize=(10, 3.8))
            loss_ax, acc_ax = fig.subplots(1, 2)
        else:
            import matplotlib.pyplot as plt

            fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(10, 3.8))
        epochs = [record["epoch"] + 1 for record in self]
        for key, ax, label in (("train_loss", loss_ax, "train"), ("val_loss", loss_ax, "held-out"),
                               ("train_acc", acc_ax, "train"), ("val_acc", acc_ax, "held-out")):
            values = self.series(key)
            if values:
                ax.plot(epochs[:len(values)], values, marker="o", label=label)
        for ax, title in ((loss_ax, "loss"), (acc_ax, "accuracy")):
            ax.set_xlabel("epoch")
            ax.set_title(title)
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend()
        fig.tight_layout()
        if path is not None:
            fig.savefig(path, dpi=100)
        return fig


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"
    return "-" if value is None else str(value)


def _in_notebook() -> bool:
    # A kernel has IPython imported already; elsewhere importing it only to ask would cost every run ~0.1 s.
    if "IPython" not in sys.modules:
        return False
    from IPython import get_ipython

    shell = get_ipython()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})

