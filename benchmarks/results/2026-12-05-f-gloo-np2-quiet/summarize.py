"""Summarize benchmarks.ab records in this folder: per setting best-of-best, median of medians, ratio
DDP/setting (>1: faster than DDP), and rank 0's CPU ms per step: main thread, each comm-init thread
(in order of creation), process total; off-CPU = median step - main thread CPU (time the main thread waits).

    .venv/bin/python benchmarks/results/2026-12-05-f-gloo-np2-quiet/summarize.py FILE.json ...
"""

import json
import statistics
import sys

for path in sys.argv[1:]:
    runs = json.load(open(path))["runs"]
    ddp = next((recs for name, recs in runs.items() if name.startswith("ddp")), None)
    ddp_best = min(r["best_ms"] for r in ddp) if ddp else None
    ddp_med = statistics.median(r["median_ms"] for r in ddp) if ddp else None
    print(f"\n{path}")
    print(
        "| setting | runs | best ms | median ms | DDP/this best | DDP/this median | main cpu "
        "| comm threads cpu (each) | off-CPU main |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, recs in runs.items():
        best = min(r["best_ms"] for r in recs)
        med = statistics.median(r["median_ms"] for r in recs)
        main = statistics.median(
            sum(t["cpu_ms_per_step"] for t in r["threads_cpu"] if t["born"] == "main") for r in recs
        )
        ncomm = max(len([t for t in r["threads_cpu"] if t["born"] == "comm-init"]) for r in recs)
        each = []
        for i in range(ncomm):
            vals = [
                [t for t in r["threads_cpu"] if t["born"] == "comm-init"][i]["cpu_ms_per_step"]
                for r in recs
                if len([t for t in r["threads_cpu"] if t["born"] == "comm-init"]) > i
            ]
            each.append(statistics.median(vals))
        comm = statistics.median(
            sum(t["cpu_ms_per_step"] for t in r["threads_cpu"] if t["born"] == "comm-init") for r in recs
        )
        other = statistics.median(
            sum(t["cpu_ms_per_step"] for t in r["threads_cpu"] if t["born"] not in ("main", "comm-init"))
            for r in recs
        )
        loads = [r["load1_before"] for r in recs]
        print(
            f"| {name.split('@')[0]} | {len(recs)} | {best:.2f} | {med:.2f} | {ddp_best / best:.3f} "
            f"| {ddp_med / med:.3f} | {main:.1f} | {comm:.1f} ({', '.join(f'{v:.1f}' for v in each)})"
            f"{f' +later {other:.1f}' if other else ''} | {med - main:.1f} |"
            f"  load {min(loads):.2f}-{max(loads):.2f}"
        )
