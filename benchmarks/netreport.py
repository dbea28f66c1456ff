"""The network benchmark's arithmetic and table: the ring bound, fractions of it, scaling, CPU share.

The ring bound: an allreduce of S bytes over n ranks whose links carry B bytes/s takes at least
2(n-1)/n * S / B (each rank sends, and receives, 2(n-1)/n * S). S is what the gradients put on the
wire: 4 bytes a parameter, 2 with fp16 or bf16 compression. "fraction of the limit" = bound / measured step.
"""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import summarise


def ring_bound_ms(wire_bytes: float, np: int, link_bits: float) -> float:
    """2(n-1)/n * S / B in ms, for S bytes over n ranks on links of link_bits bits/s."""
    return 2 * (np - 1) / np * wire_bytes * 8 / link_bits * 1e3 if np > 1 else 0.0


def _busy_ticks() -> int:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4]  # all but idle and iowait


def _pid_ticks(pid: int, children: bool) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = stat[stat.rindex(")") + 2:].split()
    return sum(int(x) for x in fields[11:15 if children else 13])  # utime stime [cutime cstime]


class CpuShare:
    """The share of the machine's CPU that processes other than this benchmark used during one job:
    (busy time of all CPUs - ours) / (wall x CPUs). Ours: this process and its waited-for children
    (launchers, torchrun, mpirun, ssh) plus each host's sshd and what it reaped (the remote ranks)."""

    def __init__(self, cluster: Any) -> None:
        self.sshd = [n.sshd.pid for n in cluster.workers if n.sshd is not None]
        self.start = self._sample()

    def _sample(self) -> tuple[float, int, float]:
        own = os.times()
        ours = own.user + own.system + own.children_user + own.children_system
        ours += sum(_pid_ticks(pid, children=True) for pid in self.sshd) / os.sysconf("SC_CLK_TCK")
        return time.monotonic(), _busy_ticks(), ours

    def stop(self) -> dict[str, Any]:
        (t0, busy0, ours0), (t1, busy1, ours1) = self.start, self._sample()
        wall, busy = t1 - t0, (busy1 - busy0) / os.sysconf("SC_CLK_TCK")
        cpus = os.cpu_count() or 1
        return {"wall_s": round(wall, 2), "ours_cpu_s": round(ours1 - ours0, 2),
                "others_cpu_share": max(0.0, (busy - (ours1 - ours0)) / (wall * cpus)) if wall > 0 else 0.0,
                "loadavg": [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]}


def summarise_cell(spec: dict[str, Any], records: list[dict[str, Any]], np: int, link_bits: float) -> dict[str, Any]:
    """benchmarks.harness's summary of a variant (the one benchmarks.run keeps), plus bytes on the wire,
    the ring bound and the machine's load."""
    row = summarise(spec["name"], spec, records)
    row["loadavg"] = [r["loadavg"] for r in records]
    row["others_cpu_share"] = [round(r["others_cpu_share"], 3) for r in records]
    ok = [r for r in records if "error" not in r]
    if not ok:
        return row
    compression = ok[0].get("compression", "none")
    wire = row["grad_bytes"] / (2 if compression in ("fp16", "bf16") else 1)
    row.update(compression=compression, wire_grad_bytes=wire, ring_bound_ms=ring_bound_ms(wire, np, link_bits))
    per_rank = [r["tx_bytes_per_rank"] for r in ok if r.get("tx_bytes_per_rank")]
    if per_rank and np > 1:
        ranks = [statistics.median(run[i] for run in per_rank if i < len(run)) for i in range(np)]
        busiest = max(ranks)
        row.update(tx_bytes_per_rank=ranks, tx_bytes_per_step=busiest,
                   tx_over_ring_bytes=busiest / (2 * (np - 1) / np * wire),  # >1: headers, control traffic
                   tx_time_ms=busiest * 8 / link_bits * 1e3)
    if np > 1 and spec["variant"] != "compute":
        row["fraction_of_limit"] = row["ring_bound_ms"] / row["best_ms"]
        row["fraction_of_limit_median"] = row["ring_bound_ms"] / row["median_ms"]
    return row


def _best(groups: dict[str, Any], group: str, name: str, key: str = "best_ms") -> float | None:
    return groups.get(group, {}).get(name, {}).get(key)


def ratios(groups: dict[str, Any], backends: list[str], link_bits: float) -> dict[str, dict[str, float]]:
    """Per model and np>1: speed ratios (>1: hvdtrain faster), step over max(compute, bound), fp16 and bf16."""
    out: dict[str, dict[str, float]] = {}
    for group in groups:
        np = int(group.rsplit("np", 1)[1])
        if np == 1:
            continue
        r: dict[str, float] = {}
        compute = _best(groups, group, "compute")
        for backend in backends:
            ours = _best(groups, group, f"hvdtrain-{backend}")
            if not ours:
                continue
            for ref in ("ddp", f"horovod-{backend}"):
                if (theirs := _best(groups, group, ref)) is not None:
                    r[f"hvdtrain_{backend}_vs_{ref.split('-')[0]}"] = theirs / ours
                if (theirs_med := _best(groups, group, ref, "median_ms")) is not None:
                    r[f"hvdtrain_{backend}_vs_{ref.split('-')[0]}_median"] = (
                        theirs_med / groups[group][f"hvdtrain-{backend}"]["median_ms"])
            bound = groups[group][f"hvdtrain-{backend}"]["ring_bound_ms"]
            if compute:
                r[f"step_over_max_compute_bound_{backend}"] = ours / max(compute, bound)
            fp32 = groups[group][f"hvdtrain-{backend}"]
            for wire in ("fp16", "bf16"):
                half = groups[group].get(f"hvdtrain-{backend}-{wire}", {})
                if half.get("best_ms"):
                    r[f"{wire}_speedup_{backend}"] = ours / half["best_ms"]
                    r[f"{wire}_speedup_median_{backend}"] = fp32["median_ms"] / half["median_ms"]
                    fp32_tx = fp32.get("tx_bytes_per_step")
                    if fp32_tx and half.get("tx_bytes_per_step"):
                        r[f"{wire}_tx_bytes_ratio_{backend}"] = half["tx_bytes_per_step"] / fp32_tx
        out[group] = r
    return out


def scaling(groups: dict[str, Any], backends: list[str], link_bits: float) -> dict[str, list[dict[str, Any]]]:
    """Weak scaling per model: efficiency = np=1 step / np=n step (= throughput_n / (n x throughput_1)),
    beside the ring bound's prediction with perfect overlap (t1 / max(t1, bound)) and with none
    (t1 / (t1 + bound))."""
    out: dict[str, list[dict[str, Any]]] = {}
    for model in sorted({g.split("/")[0] for g in groups}):
        t1 = _best(groups, f"{model}/np1", "hvdtrain")
        single = _best(groups, f"{model}/np1", "single")
        rows = []
        for group in sorted(g for g in groups if g.startswith(f"{model}/")):
            np = int(group.rsplit("np", 1)[1])
            row: dict[str, Any] = {"np": np}
            if np == 1:
                row.update(hvdtrain_ms=t1, single_ms=single)
            elif t1:
                some = next(iter(r for r in groups[group].values() if "grad_bytes" in r), None)
                if some is None:
                    continue
                bound = ring_bound_ms(some["grad_bytes"], np, link_bits)
                row.update(ring_bound_ms=bound, predicted_overlap=t1 / max(t1, bound),
                           predicted_no_overlap=t1 / (t1 + bound))
                for name, ref in [*((f"hvdtrain-{b}", t1) for b in backends), ("ddp", single),
                                  *((f"horovod-{b}", single) for b in backends)]:
                    step = _best(groups, group, name)
                    if step and ref:
                        row[f"efficiency_{name}"] = ref / step
            rows.append(row)
        out[model] = rows
    return out


def table(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [f"hvdtrain network benchmarks  {meta['started']}  link {meta['link']} each way per host (tbf), "
             f"hosts {meta['hosts']}, load avg before/after {meta['loadavg_before']} / {meta['loadavg_after']}, "
             f"{meta['cpus']} CPUs, rounds={meta['rounds']}, steps/run={meta['steps']}; one TCP stream over the "
             f"link carried {meta.get('link_probe_mbit', '-')} Mbit/s", "",
             f"{'group':<15} {'variant':<18} {'best ms':>8} {'median':>8} {'tx MB/st':>9} {'tx/ring':>7} "
             f"{'bound ms':>8} {'frac':>5} {'load1':>11} {'others':>11}",
             "(tx MB/st: bytes the busiest rank's host sent per step, counted; tx/ring: over 2(n-1)/n x wire "
             "gradient bytes; bound: ring bound of those gradient bytes at the link rate; frac: bound / best "
             "step; load1: 1-min load per run; others: CPU share of other processes per run)"]
    for group, rows in result["groups"].items():
        for row in rows.values():
            load = "/".join(f"{x[0]:.1f}" for x in row["loadavg"])
            others = "/".join(f"{x:.2f}" for x in row["others_cpu_share"])
            if "best_ms" not in row:
                lines.append(f"{group:<15} {row['name']:<18} FAILED ({row['failed']}/{row['runs']})  {load} {others}")
                continue
            tx = f"{row['tx_bytes_per_step'] / 1e6:.2f}" if "tx_bytes_per_step" in row else "-"
            ratio = f"{row['tx_over_ring_bytes']:.2f}" if "tx_over_ring_bytes" in row else "-"
            frac = f"{row['fraction_of_limit']:.2f}" if "fraction_of_limit" in row else "-"
            lines.append(f"{group:<15} {row['name']:<18} {row['best_ms']:>8.1f} {row['median_ms']:>8.1f} {tx:>9} "
                         f"{ratio:>7} {row['ring_bound_ms']:>8.1f} {frac:>5} {load:>11} {others:>11}")
    lines += ["", "ratios (speed: >1 means hvdtrain faster; step_over_*: step / ideal, lower is better)"]
    for group, r in result["ratios"].items():
        lines += [f"  {group:<15} {key:<40} {value:.3f}" for key, value in r.items()]
    lines += ["", "weak scaling: efficiency = np=1 step / np=n step (hvdtrain against hvdtrain np=1, DDP and the "
                  "hand-written loop against the plain loop); predicted from the ring bound with full / no overlap"]
    for model, rows in result["scaling"].items():
        for row in rows:
            cells = "  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items())
            lines.append(f"  {model:<12} {cells}")
    return "\n".join(lines)
