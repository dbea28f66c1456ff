"""The local benchmark's report: speed ratios against the issue's targets, the table, the chart.

benchmarks/run.py measures; this turns its result ({"meta", "groups", "bandwidth"}) into the ratios
(ratios(): >1 means hvdtrain faster, from best-of-N step times), the text table (results.md and stdout)
and the figure (results.png). The network benchmark's counterpart is benchmarks/netreport.py.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any


def ratios(groups: dict[str, dict[str, dict[str, Any]]], backends: list[str]) -> dict[str, Any]:
    """The issue's targets, as speed ratios (>1 = hvdtrain faster), from best-of-N step times."""
    def best(group: str, name: str) -> float | None:
        return groups.get(group, {}).get(name, {}).get("best_ms")

    out: dict[str, Any] = {}
    for model in sorted({g.split("/")[0] for g in groups}):
        one, two = f"{model}/np1", f"{model}/np2"
        r: dict[str, Any] = {}
        pairs = [("hvdtrain_vs_horovod_np1", best(one, "horovod"), best(one, "hvdtrain")),
                 ("hvdtrain_vs_single_np1", best(one, "single"), best(one, "hvdtrain")),
                 ("ddp_vs_single_np1", best(one, "single"), best(one, "ddp"))]
        for backend in backends:
            hvt = best(two, f"hvdtrain-{backend}")
            pairs += [(f"hvdtrain_vs_horovod_np2_{backend}", best(two, f"horovod-{backend}"), hvt),
                      (f"hvdtrain_vs_ddp_np2_{backend}", best(two, "ddp"), hvt)]
            compute, comm = best(two, "compute"), best(two, f"allreduce-{backend}")
            comm_row = groups.get(two, {}).get(f"allreduce-{backend}", {})
            if comm_row.get("median_cpu_ms") and comm_row.get("median_ms"):
                # Near 1: the allreduce keeps its (one) core busy, so it cannot hide behind compute there.
                r[f"allreduce_cpu_over_wall_{backend}"] = comm_row["median_cpu_ms"] / comm_row["median_ms"]
            if hvt and compute and comm:
                # Step time over the ideal of perfect overlap: target <= 1.15.
                r[f"step_over_max_compute_comm_{backend}"] = hvt / max(compute, comm)
                r[f"step_over_sum_compute_comm_{backend}"] = hvt / (compute + comm)
            single = best(one, "hvdtrain")
            if hvt and single:
                # Weak scaling: throughput at np=2 over twice the one-worker throughput.
                r[f"scaling_efficiency_hvdtrain_{backend}"] = single / hvt
        ddp1, ddp2 = best(one, "ddp"), best(two, "ddp")
        if ddp1 and ddp2:
            r["scaling_efficiency_ddp"] = ddp1 / ddp2
        for key, reference, ours in pairs:
            if reference and ours:
                r[key] = reference / ours
        out[model] = r
    return out


def table(result: dict[str, Any]) -> str:
    lines = [f"hvdtrain benchmarks  {result['meta']['started']}  load avg before/after "
             f"{result['meta']['loadavg_before']} / {result['meta']['loadavg_after']}  "
             f"({result['meta']['cpus']} CPUs; rounds={result['meta']['rounds']}, steps/run={result['meta']['steps']}"
             f"{''.join(f', {m}: {n}' for m, n in result['meta'].get('model_steps', {}).items())})",
             "", f"{'group':<16} {'variant':<18} {'best ms':>9} {'median ms':>10} {'cpu ms':>7} {'comm cpu':>8} "
             f"{'samples/s':>10} {'x best':>7} {'runs':>5}",
             "(x best: best ms over the group's fastest training variant; cpu ms: median CPU time per step of "
             "rank 0's process, all threads; comm cpu: of which its communication threads)"]
    for group, rows in result["groups"].items():
        fastest = min((r["best_ms"] for r in rows.values() if "best_ms" in r and r["variant"] != "allreduce"),
                      default=None)
        for row in rows.values():
            if "best_ms" not in row:
                lines.append(f"{group:<16} {row['name']:<18} FAILED ({row['failed']}/{row['runs']} runs)")
                continue
            sps = f"{row['samples_per_s']:.0f}" if "samples_per_s" in row else "-"
            rel = f"{row['best_ms'] / fastest:.2f}" if fastest else "-"
            failed = f" ({row['failed']} failed)" if row["failed"] else ""
            failed += f" ({len(row['retried_after'])} retried)" if "retried_after" in row else ""
            cpu = f"{row['median_cpu_ms']:.1f}" if "median_cpu_ms" in row else "-"
            comm = f"{row['comm_thread_cpu_ms']:.1f}" if "comm_thread_cpu_ms" in row else "-"
            lines.append(f"{group:<16} {row['name']:<18} {row['best_ms']:>9.1f} {row['median_ms']:>10.1f} "
                         f"{cpu:>7} {comm:>8} {sps:>10} {rel:>7} {row['runs']:>5}{failed}")
    lines += ["", "ratios (speed: >1 means hvdtrain faster; step_over_*: step time / ideal, lower is better)"]
    for model, r in result["ratios"].items():
        for key, value in r.items():
            lines.append(f"  {model:<11} {key:<40} {value:.3f}")
    if result["bandwidth"]:
        lines += ["", f"allreduce bus bandwidth GB/s (np={result['meta']['bandwidth_np']}; memcpy: bytes/s), best of "
                      f"{result['meta']['bandwidth_iters']}",
                  f"  {'MB':>6} " + " ".join(f"{name:>14}" for name in result["bandwidth"])]
        sizes = sorted({row["size_mb"] for rows in result["bandwidth"].values() for row in rows})
        for mb in sizes:
            cells = []
            for rows in result["bandwidth"].values():
                hit = [row for row in rows if row["size_mb"] == mb]
                cells.append(f"{hit[0]['busbw_gbs']:>14.3f}" if hit else f"{'-':>14}")
            lines.append(f"  {mb:>6g} " + " ".join(cells))
    return "\n".join(lines)


def chart(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    labels, best, median = [], [], []
    for group, rows in result["groups"].items():
        for row in rows.values():
            if "best_ms" in row:
                labels.append(f"{group} {row['name']}")
                best.append(row["best_ms"])
                median.append(row["median_ms"])
    y = range(len(labels))
    axes[0].barh(list(y), median, color="#cbd5e8", label="median")
    axes[0].barh(list(y), best, color="#1f77b4", height=0.5, label="best")
    axes[0].set_yticks(list(y), labels, fontsize=7)
    axes[0].invert_yaxis()
    axes[0].set_xlabel("ms / step")
    axes[0].legend()
    axes[0].set_title("training step time")
    for name, rows in result["bandwidth"].items():
        axes[1].plot([r["size_mb"] for r in rows], [r["busbw_gbs"] for r in rows], marker="o", label=name)
    axes[1].set_xscale("log", base=2)
    axes[1].set_yscale("log")
    axes[1].set_xlabel("message size (MB)")
    axes[1].set_ylabel("bus bandwidth (GB/s)")
    axes[1].set_title("allreduce (memcpy: copy rate)")
    if result["bandwidth"]:
        axes[1].legend()
    fig.suptitle(f"hvdtrain benchmarks, load avg {result['meta']['loadavg_before']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
