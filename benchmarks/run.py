"""hvdtrain benchmarks: one command, variants side by side, alternating A B A B to cancel drift.

    python -m benchmarks.run                 # full size (minutes); results in bench-results/
    python -m benchmarks.run --smoke         # tiny sizes, end to end (CI): checks the harness, not speed

Each (model, np) group runs every variant once per round, in the same order, for --rounds rounds;
a variant's best-of-N and median pool its step times over all rounds. Outputs: a table on stdout
and in results.md, results.json, results.png. See benchmarks/README.md for what the numbers mean.

A full run (not --smoke, no failed variant) whose --out is a folder directly in benchmarks/results/
becomes the newest figures: benchmarks/results/latest (a one-line text file) then holds its folder
name; `latest_run()` reads it.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
RESULTS = ROOT / "benchmarks" / "results"
LATEST = "latest"  # in RESULTS: a text file holding the newest full run's folder name


def horovodrun(np: int, backend: str, env_args: dict[str, str]) -> list[str]:
    return [str(BIN / "horovodrun"), "-np", str(np), "-H", f"localhost:{np}", f"--{backend}",
            "--start-timeout", "120", "--disable-cache", "--network-interfaces", "lo", sys.executable]


def torchrun(np: int) -> list[str]:
    return [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={np}", "--no-python", sys.executable]


def variants(np: int, backends: list[str], light: bool = False) -> list[dict[str, Any]]:
    """What runs in one (model, np) group: name, worker variant, launcher, Horovod backend.

    light (the smoke run's extra models): each code path of the workload once, hvdtrain and the two
    loops it is compared with at np=2, hvdtrain alone at np=1."""
    if light:
        backend = backends[0]
        if np == 1:
            return [{"name": "hvdtrain", "variant": "hvdtrain", "launcher": "python"}]
        return [{"name": "ddp", "variant": "ddp", "launcher": "torchrun"},
                {"name": f"hvdtrain-{backend}", "variant": "hvdtrain", "launcher": "horovodrun", "backend": backend},
                {"name": f"horovod-{backend}", "variant": "horovod", "launcher": "horovodrun", "backend": backend}]
    if np == 1:
        # One process: Horovod's size-1 path, torch's plain loop and DDP's one-process overhead.
        return [{"name": "single", "variant": "single", "launcher": "python"},
                {"name": "hvdtrain", "variant": "hvdtrain", "launcher": "python"},
                {"name": "horovod", "variant": "horovod", "launcher": "python"},
                {"name": "ddp", "variant": "ddp", "launcher": "torchrun"}]
    rows = [{"name": "ddp", "variant": "ddp", "launcher": "torchrun"},
            {"name": "compute", "variant": "compute", "launcher": "horovodrun", "backend": backends[0]}]
    for backend in backends:
        rows += [{"name": f"hvdtrain-{backend}", "variant": "hvdtrain", "launcher": "horovodrun", "backend": backend},
                 {"name": f"horovod-{backend}", "variant": "horovod", "launcher": "horovodrun", "backend": backend},
                 {"name": f"allreduce-{backend}", "variant": "allreduce", "launcher": "horovodrun",
                  "backend": backend}]
    return rows


def launch(spec: dict[str, Any], np: int, worker_args: list[str], env: dict[str, str],
           timeout: int, drop: list[str] | None = None) -> dict[str, Any]:
    """launch_once, and once more if it failed (once_more)."""
    return once_more(f"[bench] {spec['variant']} np={np}",
                     lambda: launch_once(spec, np, worker_args, env, timeout, drop))


def once_more(label: str, attempt: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """attempt(), and once more if its record has an error: a multi-process start can fail for reasons
    outside the variant (seen once in CI: torchrun's DDP exit 1 that no rerun reproduced). The failure is
    printed and kept in the record ("retried_after"), so a retry never hides what happened."""
    record = attempt()
    if "error" not in record:
        return record
    print(f"{label} failed ({record['error']}), retrying once; its output ends:\n{record['output_tail']}",
          file=sys.stderr, flush=True)
    retry = attempt()
    if "error" in retry:
        print(f"{label} failed again ({retry['error']}); its output ends:\n{retry['output_tail']}",
              file=sys.stderr, flush=True)
    return {**retry, "retried_after": record["output_tail"]}


def launch_once(spec: dict[str, Any], np: int, worker_args: list[str], env: dict[str, str],
                timeout: int, drop: list[str] | None = None) -> dict[str, Any]:
    """Run one worker job; return rank 0's record, or an error record (the table shows it).

    env is added to this process's environment; drop names variables to remove from it."""
    launcher = spec["launcher"]
    with tempfile.TemporaryDirectory(prefix="hvdtrain-bench-") as scratch:
        result = Path(scratch) / "result.json"
        worker = ["-m", "benchmarks.worker", "--variant", spec["variant"], "--launcher", launcher,
                  "--result", str(result), *worker_args]
        if launcher == "horovodrun":
            cmd = horovodrun(np, spec["backend"], env) + worker
        elif launcher == "torchrun":
            cmd = torchrun(np) + worker
        else:
            cmd = [sys.executable, *worker]
        started = time.perf_counter()
        full_env = {key: value for key, value in {**os.environ, **env}.items() if key not in (drop or [])}
        out, code = run_job(cmd, full_env, timeout)
        record = json.loads(result.read_text()) if code == 0 and result.exists() else None
    if record is None:
        tail = (out if isinstance(out, str) else out.decode())[-4000:]  # torchrun's own summary alone is ~1.5 kB
        return {"error": f"exit {code}", "output_tail": tail, "launch_s": time.perf_counter() - started}
    return {**record, "launch_s": time.perf_counter() - started}


def run_job(cmd: list[str], env: dict[str, str], timeout: int) -> tuple[str, int]:
    """(output, exit code; -1 on timeout). A timeout ends mpirun and its ranks too, not only the
    launcher (a hung rank kept spinning and skewed later runs)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return out, proc.returncode
    except subprocess.TimeoutExpired:
        # Horovod's launcher runs mpirun in a process group of its own: end the whole tree, by PID.
        for pid in [proc.pid, *descendants(proc.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out, _ = proc.communicate()
        return f"{out}timed out after {timeout}s", -1


def descendants(root: int) -> list[int]:
    """Every process below `root` (children, grandchildren...), from /proc's parent links."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def summarise(name: str, spec: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in records if "error" not in r]
    row: dict[str, Any] = {"name": name, "variant": spec["variant"], "launcher": spec["launcher"],
                           "backend": spec.get("backend"), "runs": len(records), "failed": len(records) - len(ok)}
    retried = [r["retried_after"] for r in records if "retried_after" in r]
    if retried:
        row["retried_after"] = retried
    if len(ok) < len(records):
        row["errors"] = [r["output_tail"] for r in records if "error" in r]  # kept: a failure is a result too
    if not ok:
        return row
    times = [t for r in ok for t in r["step_ms"]]
    first = ok[0]
    row.update({"params": first["params"], "grad_bytes": first["grad_bytes"], "batch_size": first["batch_size"],
                "np": first["np"], "best_ms": min(times), "median_ms": statistics.median(times),
                "round_best_ms": [r["best_ms"] for r in ok], "samples": len(times)})
    cpu = [t for r in ok for t in r.get("cpu_ms", [])]
    if cpu:
        row["median_cpu_ms"] = statistics.median(cpu)  # rank 0's process CPU time per step (all threads)
    comm = [sum(t["cpu_ms_per_step"] for t in r["threads_cpu"] if t["born"] == "comm-init")
            for r in ok if r.get("threads_cpu") is not None]   # measured, if perhaps below one tick
    if comm:
        # CPU per step of the threads the communication init started (Horovod's background thread,
        # DDP's gloo threads), median over runs: on one core per rank, time the training thread lacks.
        row["comm_thread_cpu_ms"] = statistics.median(comm)
    if spec["variant"] != "allreduce":
        row["samples_per_s"] = first["batch_size"] * first["np"] * 1e3 / row["best_ms"]
    return row


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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny models and sizes: checks the harness")
    parser.add_argument("--out", default="bench-results", help="folder for results.json/.md/.png")
    parser.add_argument("--models", default="mlp,cnn,resnet18,transformer")
    parser.add_argument("--nps", default="1,2", help="worker counts, e.g. 1,2")
    parser.add_argument("--backends", default="gloo,mpi", help="Horovod backends at np>1 (horovodrun --gloo/--mpi)")
    parser.add_argument("--rounds", type=int, default=2, help="A B A B rounds per group")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run")
    parser.add_argument("--model-steps", default="", metavar="MODEL=N,...",
                        help="timed steps per run for some models instead of --steps, e.g. resnet18=15 "
                             "(its step is 3-5x the others': keeps a full run affordable)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--no-pin", dest="pin", action="store_false", help="do not pin one core per rank")
    parser.add_argument("--bandwidth", default="horovod-gloo,horovod-mpi,torch-gloo,memcpy",
                        help="allreduce sweep implementations; empty to skip")
    parser.add_argument("--sizes", default="1,4,16,64", help="sweep message sizes in MB")
    parser.add_argument("--iters", type=int, default=5, help="timed allreduces per size")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="extra environment for every worker, e.g. HOROVOD_CYCLE_TIME=5")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per launched job")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="cuda: one GPU per rank by local rank, DDP and the torch sweep on NCCL (untested here)")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                        help="autocast for every training variant (fp16: CUDA only, with a GradScaler)")
    parser.add_argument("--hosts", default="", metavar="N[,N...]",
                        help="network mode (benchmarks/network.py): N network-namespace hosts, one rank each, "
                             "every link limited to --link by tc tbf (root); e.g. 2,3")
    parser.add_argument("--link", default="1gbit", help="with --hosts: each host's link rate, tc syntax (1gbit)")
    parser.add_argument("--only", default="", metavar="NAME,...",
                        help="with --hosts: run only these variants, e.g. hvdtrain-mpi,horovod-mpi")
    args = parser.parse_args(argv)
    if args.hosts and args.smoke:
        # network smoke (CI): the tiny MLP, hvdtrain-gloo and DDP over 2 hosts, one round
        args.steps, args.warmup, args.models, args.backends = 4, 1, "mlp", "gloo"
    elif args.smoke:
        # Every launcher and code path once, as small as possible: the MLP with every variant (Gloo
        # only, two rounds of the cheap np=1 group, one at np=2: each horovodrun start costs seconds),
        # then the real-size workloads at toy sizes, light variant sets (see variants()).
        args.steps, args.warmup, args.sizes, args.iters = 3, 1, "0.25,1", 2
        args.models, args.backends = "mlp,resnet18,transformer", "gloo"
        args.bandwidth = "horovod-gloo,torch-gloo,memcpy"
    return args


def is_full(result: dict[str, Any]) -> bool:
    """A run that may stand as the newest figures: not a smoke run, and no variant failed."""
    return not result["meta"]["smoke"] and not any(
        row.get("failed") for rows in result["groups"].values() for row in rows.values())


def update_latest(out: Path, result: dict[str, Any], root: Path = RESULTS) -> bool:
    """Point root/latest at `out` if it is a full run saved directly in `root`. Returns whether it did.

    The pointer is a text file (the folder name and a newline), written atomically: portable where
    symlinks are not (Windows checkouts, some CI artifact stores), and readable by any script."""
    if not is_full(result) or out.resolve().parent != root.resolve():
        return False
    tmp = root / f".{LATEST}.tmp"
    tmp.write_text(out.resolve().name + "\n")
    tmp.replace(root / LATEST)
    return True


def latest_run(root: Path = RESULTS) -> Path | None:
    """The newest full run's folder (holding results.json), or None if there is no valid pointer."""
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    name = pointer.read_text().strip()
    folder = root / name
    if not name or "/" in name or name in (".", "..") or not (folder / "results.json").is_file():
        return None
    return folder


def git_head() -> str | None:
    """The commit measured (with '+dirty' for uncommitted changes), for reading a result later."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) or None


def run(args: argparse.Namespace, partial: Path | None = None) -> dict[str, Any]:
    """All groups, then the sweep. After each group the results so far go to `partial` (if given),
    so a run cut short still leaves its finished groups behind."""
    models = [m for m in args.models.split(",") if m]
    nps = [int(n) for n in args.nps.split(",") if n]
    backends = [b for b in args.backends.split(",") if b]
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(args.threads)}
    # No HOROVOD_THREAD_AFFINITY: communication threads (Horovod's background thread, DDP's gloo
    # threads) are started in init, before the worker pins its rank, so both keep the process's
    # first affinity alike, as in a real hvdtrain run, which pins nothing. (Pinning Horovod's thread
    # to its rank's core, as earlier runs did, handicapped Horovod against DDP.)
    env.update(kv.split("=", 1) for kv in args.env)
    model_steps = {model: int(n) for model, _, n in (kv.partition("=") for kv in args.model_steps.split(",") if kv)}
    worker_args = ["--warmup", str(args.warmup), "--threads", str(args.threads),
                   "--device", args.device, "--precision", args.precision]
    worker_args += ["--pin"] if args.pin else []
    worker_args += ["--smoke"] if args.smoke else []
    meta = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "cpus": os.cpu_count(),
            "loadavg_before": [round(x, 2) for x in os.getloadavg()], "python": platform.python_version(),
            "rounds": args.rounds, "steps": args.steps, "model_steps": model_steps, "warmup": args.warmup,
            "threads": args.threads,
            "pin": args.pin, "smoke": args.smoke, "env": env, "argv": sys.argv[1:], "device": args.device,
            "precision": args.precision, "git": git_head()}
    try:
        import horovod
        import torch

        meta.update(torch=torch.__version__, horovod=horovod.__version__)
    except ImportError:
        pass

    groups: dict[str, dict[str, dict[str, Any]]] = {}
    for index, model in enumerate(models):
        for np in nps:
            group = f"{model}/np{np}"
            specs = variants(np, backends, light=args.smoke and index > 0)
            records: dict[str, list[dict[str, Any]]] = {s["name"]: [] for s in specs}
            rounds = 1 if args.smoke and (np > 1 or index > 0) else args.rounds  # smoke: the MLP alternates
            for round_no in range(rounds):
                order = specs if round_no % 2 == 0 else specs[::-1]  # A B C, C B A: no variant always first
                for spec in order:
                    steps = model_steps.get(model, args.steps)
                    rec = launch(spec, np, [*worker_args, "--steps", str(steps), "--model", model], env, args.timeout)
                    records[spec["name"]].append(rec)
                    shown = f"{rec['best_ms']:.1f} ms best" if "best_ms" in rec else rec["error"]
                    print(f"[bench] {group} round {round_no + 1} {spec['name']}: {shown}", flush=True)
            groups[group] = {s["name"]: summarise(s["name"], s, records[s["name"]]) for s in specs}
            if partial:
                partial.write_text(json.dumps({"meta": meta, "groups": groups}, indent=1))

    bandwidth: dict[str, list[dict[str, Any]]] = {}
    bw_np = max(max(nps), 2)
    for impl in [b for b in args.bandwidth.split(",") if b]:
        kind, _, backend = impl.partition("-")
        spec = {"variant": f"bw-{kind}", "launcher": {"horovod": "horovodrun", "torch": "torchrun"}.get(kind, "python"),
                "backend": backend}
        rec = launch(spec, bw_np if kind != "memcpy" else 1,
                     ["--sizes", args.sizes, "--iters", str(args.iters), "--threads", str(args.threads),
                      "--device", args.device, *(["--pin"] if args.pin else [])], env, args.timeout)
        print(f"[bench] bandwidth {impl}: {'ok' if 'rows' in rec else rec['error']}", flush=True)
        bandwidth[impl] = rec.get("rows", [])
        if "rows" not in rec:
            meta.setdefault("errors", {})[impl] = rec.get("output_tail", "")

    meta.update(loadavg_after=[round(x, 2) for x in os.getloadavg()], bandwidth_np=bw_np,
                bandwidth_iters=args.iters)
    return {"meta": meta, "groups": groups, "ratios": ratios(groups, backends), "bandwidth": bandwidth}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("horovodrun", path=str(BIN)) is None:
        print("benchmarks: horovodrun is not in this Python's bin folder; run `make setup` first", file=sys.stderr)
        return 2
    if args.hosts:
        from benchmarks.network import main_network

        return main_network(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = run(args, partial=out / "results.partial.json")
    (out / "results.partial.json").unlink(missing_ok=True)
    text = table(result)
    (out / "results.json").write_text(json.dumps(result, indent=1))
    (out / "results.md").write_text("```\n" + text + "\n```\n")
    chart(result, out / "results.png")
    print(text)
    print(f"\nwrote {out / 'results.json'}, {out / 'results.md'}, {out / 'results.png'}")
    if update_latest(out, result):
        print(f"{RESULTS.relative_to(ROOT) / LATEST} -> {out.resolve().name}")
    failed = [f"{g} {r['name']}" for g, rows in result["groups"].items() for r in rows.values() if r.get("failed")]
    if failed:
        print(f"benchmarks: {len(failed)} variant(s) had failed runs: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
