"""How a benchmark rank times itself: step stamps, CPU per step, CPU per thread, bytes sent.

Every step variant is timed the same way: StepClock's forward pre-hook stamps the start of each
training forward pass, so a step's time is the gap between consecutive stamps. That covers the data
loader, forward, backward, gradient exchange and optimizer, and leaves out evaluation (model.eval()).
Beside the wall time it stamps the process's CPU time; ThreadLedger splits that CPU time by thread
(the training thread apart from Horovod's background thread or DDP's gloo threads), and with
BENCH_IFACE set (benchmarks/network.py) the clock counts the bytes the host sent over the timed steps.
Linux only where it reads /proc; imports nothing of hvdtrain.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn


def thread_cpu_ms() -> dict[int, tuple[str, float]]:
    """CPU time (user + system, ms) of every thread of this process: {tid: (name, ms)}. Linux only."""
    tick = 1e3 / os.sysconf("SC_CLK_TCK")
    found = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue  # the thread ended
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is field 3
        found[int(task.name)] = (stat[stat.index("(") + 1:stat.rindex(")")], (int(fields[11]) + int(fields[12])) * tick)
    return found


class ThreadLedger:
    """Which threads exist when (before init, after the communication init, later), and the CPU time
    each used over the timed steps: tells the rank's main thread apart from Horovod's background
    thread (or DDP's gloo threads) without a profiler."""

    def __init__(self) -> None:
        self.known: dict[int, str] = {}
        self.mark("before-init")
        self.first: dict[int, tuple[str, float]] = {}
        self.last: dict[int, tuple[str, float]] = {}

    def mark(self, tag: str) -> None:
        if not Path("/proc/self/task").exists():
            return
        for tid in thread_cpu_ms():
            self.known.setdefault(tid, "main" if tid == os.getpid() else tag)

    def start(self) -> None:
        self.first = thread_cpu_ms() if Path("/proc/self/task").exists() else {}

    def stop(self) -> None:
        self.last = thread_cpu_ms() if self.first else {}

    def per_step(self, steps: int) -> list[dict[str, Any]] | None:
        """CPU ms per timed step of each thread that used any, busiest first; None where not measured.

        /proc counts CPU in 10 ms ticks: over a few short steps (the smoke run) no thread may show any."""
        if not self.first or not self.last or steps <= 0:
            return None
        rows = []
        for tid, (name, ms) in self.last.items():
            used = ms - self.first.get(tid, (name, 0.0))[1]
            if used > 0:
                rows.append({"tid": tid, "name": name, "born": self.known.get(tid, "during-steps"),
                             "cpu_ms_per_step": used / steps})
        return sorted(rows, key=lambda r: -r["cpu_ms_per_step"])


class StepClock:
    """Stamps the start of every training forward pass of `model`. With `sync` (CUDA), waits for the
    device first, so a stamp marks the end of the previous step's GPU work too."""

    def __init__(self, model: nn.Module, ledger: ThreadLedger | None = None, warmup: int = 0, total: int = 0,
                 sync: bool = False) -> None:
        self.stamps: list[float] = []
        self.cpu_stamps: list[float] = []  # CPU time of the whole process (all its threads)
        self.ledger, self.warmup, self.total, self.sync = ledger, warmup, total, sync
        # benchmarks.network: the host's interface, counted over exactly the timed steps (one rank per host)
        self.iface = os.environ.get("BENCH_IFACE", "")
        self.tx: list[int | None] = []
        model.register_forward_pre_hook(self._stamp)

    def _stamp(self, module: nn.Module, args: Any) -> None:
        if module.training:
            self.stamp()

    def stamp(self) -> None:
        if self.sync:
            torch.cuda.synchronize()
        self.stamps.append(time.perf_counter())
        self.cpu_stamps.append(time.process_time())
        if self.ledger is not None and len(self.stamps) == self.warmup + 1:
            self.ledger.start()  # per-thread CPU over exactly the timed steps
        if self.ledger is not None and len(self.stamps) == self.total:
            self.ledger.stop()
        if self.iface and len(self.stamps) in (self.warmup + 1, self.total):
            self.tx.append(tx_bytes(self.iface))

    def tx_bytes_per_step(self) -> float | None:
        """Bytes this host sent per timed step (counters, not assumed), None where not counted."""
        if len(self.tx) != 2 or None in self.tx or self.total - self.warmup - 1 <= 0:
            return None
        first, last = self.tx
        assert first is not None and last is not None
        return (last - first) / (self.total - self.warmup - 1)

    def step_ms(self, warmup: int) -> list[float]:
        return _gaps_ms(self.stamps)[warmup:]

    def cpu_ms(self, warmup: int) -> list[float]:
        """CPU time per step. With the rank pinned to one core, cpu / wall near 1 means that core had
        no idle time left in which communication could have overlapped compute."""
        return _gaps_ms(self.cpu_stamps)[warmup:]


def tx_bytes(iface: str) -> int | None:
    """Bytes this network namespace has sent through `iface` (/proc/net/dev is per namespace), or None."""
    for line in Path("/proc/net/dev").read_text().splitlines()[2:]:
        name, _, counters = line.partition(":")
        if name.strip() == iface:
            return int(counters.split()[8])  # receive has 8 fields (bytes first), then transmit bytes
    return None


def _gaps_ms(stamps: list[float]) -> list[float]:
    return [(b - a) * 1e3 for a, b in zip(stamps, stamps[1:], strict=False)]
