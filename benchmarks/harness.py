"""The benchmark harness: how one worker job is launched, retried, ended and summarised.

Shared by every launcher of benchmark workers (benchmarks/run.py, benchmarks/network.py,
benchmarks/ab.py) and imports none of them: the paths (ROOT, BIN), the horovodrun and torchrun
command lines, launch / launch_once / once_more (one job, and once more after a failure), run_job
(a job with a timeout that ends its whole process tree), summarise (a variant's runs into one row)
and git_head (the commit measured).
"""
from __future__ import annotations

import json
import os
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


def horovodrun(np: int, backend: str, env_args: dict[str, str]) -> list[str]:
    return [str(BIN / "horovodrun"), "-np", str(np), "-H", f"localhost:{np}", f"--{backend}",
            "--start-timeout", "120", "--disable-cache", "--network-interfaces", "lo", sys.executable]


def torchrun(np: int) -> list[str]:
    return [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={np}", "--no-python", sys.executable]


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
