"""The comparison report: a table, report.json, and a bar chart (PNG), all written atomically."""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from hvdtrain.output.files import atomic_write, write_text

FORMAT = "hvdtrain-compress-report-1"
# (key in a model's row, column title, chart title)
_COLUMNS = (("params", "params", "parameters"), ("bytes", "bytes", "bytes on disk (state_dict file)"),
            ("export_bytes", "pt2_bytes", "bytes of the torch.export .pt2"))


def table(report: dict[str, Any]) -> str:
    """The models side by side, one row each, then how latency was measured.

    Args:
        report: as built by hvdtrain.compression.compress_api.compress (its "models" and "latency" keys).
    Returns:
        Aligned text; every number in it was measured in this run.
    """
    sizes = report["latency"]["batch_sizes"]
    compiled = any("compiled_latency_ms" in model for model in report["models"])
    head = ["model", *(title for _, title, _ in _COLUMNS), *(f"ms@batch{b}" for b in sizes),
            *(f"compiled_ms@batch{b}" for b in sizes if compiled), "val_acc"]
    rows = [head]
    for model in report["models"]:
        fast = model.get("compiled_latency_ms") or {}
        rows.append([model["name"], *(f"{model[key]:,}" for key, _, _ in _COLUMNS),
                     *(f"{model['latency_ms'][str(b)]:.3f}" for b in sizes),
                     *((f"{fast[str(b)]:.3f}" if str(b) in fast else "-") for b in sizes if compiled),
                     f"{model['val_acc']:.4f}"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths,
                                                                                                    strict=True)))
             for row in rows]
    lat = report["latency"]
    lines.append(f"latency: median of {lat['repeats']} forward passes, {lat['threads']} torch thread(s), "
                 f"batch sizes {', '.join(map(str, sizes))}, {lat['mode']}"
                 + (f"; compiled: {lat['compiled']}" if compiled else ""))
    lines.extend(f"note: {note}" for note in report["notes"])
    return "\n".join(lines)


def chart_png(report: dict[str, Any]) -> bytes:
    """A bar chart per measure (parameters, bytes, latency per batch size, accuracy), models side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = report["models"]
    names = [m["name"] for m in models]
    sizes = report["latency"]["batch_sizes"]
    panels: list[tuple[str, list[float]]] = [(title, [float(m[key]) for m in models]) for key, _, title in _COLUMNS]
    panels += [(f"latency ms, batch {b} ({report['latency']['threads']} thread(s))",
                [m["latency_ms"][str(b)] for m in models]) for b in sizes]
    if any(m.get("compiled_latency_ms") for m in models):
        panels += [(f"compiled latency ms, batch {b}",
                    [(m.get("compiled_latency_ms") or {}).get(str(b), 0.0) for m in models]) for b in sizes]
    panels.append(("held-out accuracy", [m["val_acc"] for m in models]))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.6))
    palette = ["#2b7bba", "#e08a2b", "#3a9b5c", "#b5477b", "#8c6bb1", "#b8a31f"]
    colors = ["#777777", *(palette[i % len(palette)] for i in range(len(models) - 1))]  # the original in grey
    for ax, (title, values) in zip(axes, panels, strict=True):
        bars = ax.bar(range(len(values)), values, color=colors)
        ax.set_title(title, fontsize=9)
        ax.set_xticks(range(len(values)), names, rotation=20, ha="right", fontsize=8)
        ax.bar_label(bars, fmt="%.3g", fontsize=7)
    fig.suptitle(f"hvdtrain compress --method {report['method']}", fontsize=10)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


def write(out: Path, report: dict[str, Any]) -> None:
    """report.json, report.txt (the table) and report.png in `out`."""
    write_text(out / "report.json", json.dumps(report, indent=2) + "\n")
    write_text(out / "report.txt", table(report) + "\n")
    png = chart_png(report)
    atomic_write(out / "report.png", lambda handle: handle.write(png))
