"""System metrics per host: CPU, memory and (with pynvml) GPUs, sampled by each host's local rank 0.

Metrics are named by host, `system/<host>/cpu_percent`, so a run on several hosts shows every node, not only
node 0's. A background thread samples every MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL seconds (MLflow's own
setting; default 10, 0 = off). On rank 0 the samples go straight to its tracker; on another host's local
rank 0 they wait in `drain()` for the trainer to gather them to rank 0 at each epoch's end and at the end of
`fit` (only rank 0 holds the run: other hosts may not reach the embedded store at all).
"""
from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from hvdtrain.environment import process
from hvdtrain.tracking import context

INTERVAL_ENV = "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL"
DEFAULT_S = 10.0
Sample = tuple[str, float, int, int]  # (name, value, step, unix ms), as Tracker.record_system takes them


def host_name() -> str:
    """This host as a metric key may spell it (MLflow allows letters, digits, `_ - . /` and spaces)."""
    return re.sub(r"[^\w.-]+", "_", socket.gethostname()) or "host"


def visible_gpus(environ: Mapping[str, str], count: int, uuid_of: Callable[[int], str]) -> list[tuple[int, int]]:
    """(CUDA index in this process, NVML index) of each GPU this process sees.

    NVML numbers every GPU of the host in PCI bus order and ignores CUDA_VISIBLE_DEVICES; CUDA numbers
    only the visible ones, in CUDA_VISIBLE_DEVICES's order (entries are indices or UUID prefixes; CUDA
    stops at the first it cannot use). Workers run with CUDA_DEVICE_ORDER=PCI_BUS_ID (distributed/runtime),
    so an index in CUDA_VISIBLE_DEVICES is an NVML index and the metric `gpu<N>` is the process's cuda:<N>.

    Example:
        >>> uuids = ["GPU-aaa", "GPU-bbb", "GPU-ccc"]
        >>> visible_gpus({"CUDA_VISIBLE_DEVICES": "2,GPU-a,9,0"}, 3, uuids.__getitem__)
        [(0, 2), (1, 0)]
        >>> visible_gpus({}, 2, uuids.__getitem__)
        [(0, 0), (1, 1)]
    """
    given = environ.get("CUDA_VISIBLE_DEVICES")
    if given is None:
        return [(index, index) for index in range(count)]
    pairs: list[tuple[int, int]] = []
    for entry in (part.strip() for part in given.split(",")):
        found = [i for i in range(count) if entry.startswith(("GPU-", "MIG-")) and uuid_of(i).startswith(entry)]
        if entry.isdigit() and int(entry) < count:
            nvml = int(entry)
        elif found:
            nvml = found[0]
        else:
            break
        pairs.append((len(pairs), nvml))
    return pairs


class Nvml:
    """NVML, initialised once per sampler (not at every sample), with the handles of the GPUs this process sees;
    `available` is False without pynvml (the tracking extra's nvidia-ml-py) or an NVIDIA driver."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.handles: list[tuple[int, Any]] = []
        self.available = False
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:  # no pynvml, no driver: CPU and memory only
            return
        self.pynvml = pynvml
        self.available = True

        def uuid_of(index: int) -> str:
            uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index))
            return uuid.decode() if isinstance(uuid, bytes) else str(uuid)

        pairs = visible_gpus(os.environ if environ is None else environ, pynvml.nvmlDeviceGetCount(), uuid_of)
        self.handles = [(cuda, pynvml.nvmlDeviceGetHandleByIndex(nvml)) for cuda, nvml in pairs]

    def read(self) -> dict[str, float]:
        values = {}
        for cuda, handle in self.handles:
            used = self.pynvml.nvmlDeviceGetMemoryInfo(handle)
            values[f"gpu{cuda}_utilization_percent"] = float(self.pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            values[f"gpu{cuda}_memory_percent"] = 100.0 * used.used / max(1, used.total)
        return values

    def close(self) -> None:
        if self.available:
            self.available = False
            try:
                self.pynvml.nvmlShutdown()
            except Exception:
                pass


def sample(nvml: Nvml | None = None) -> dict[str, float]:
    """One reading of this host: CPU % since the last call, memory, and each visible GPU when NVML answers.

    GPUs are read through NVML, never torch.cuda: a CUDA context made here would hold memory on every GPU.
    """
    import psutil

    memory = psutil.virtual_memory()
    values = {"cpu_percent": float(psutil.cpu_percent(None)), "memory_percent": float(memory.percent),
              "memory_used_gb": memory.used / 1e9}
    if nvml is not None and nvml.available:
        try:
            values.update(nvml.read())
        except Exception:  # a GPU that fell off the bus: CPU and memory still count
            pass
    return values


class SystemSampler:
    """A daemon thread that samples this host; `emit` takes each sample, else `drain()` hands them over."""

    def __init__(self, interval_s: float, emit: Callable[[list[Sample]], None] | None = None,
                 host: str = "") -> None:
        self.interval_s = interval_s
        self.emit = emit
        self.prefix = f"system/{host or host_name()}/"
        self.pending: list[Sample] = []
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.step = 0
        self.thread = threading.Thread(target=self._work, name="hvdtrain-system-metrics", daemon=True)
        self.thread.start()

    def drain(self) -> list[Sample]:
        """The samples since the last drain (for the trainer to gather to rank 0)."""
        with self.lock:
            taken, self.pending = self.pending, []
        return taken

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(5.0)

    def _work(self) -> None:
        nvml = Nvml()
        try:
            self._sample_until_stopped(nvml)
        finally:
            nvml.close()

    def _sample_until_stopped(self, nvml: Nvml) -> None:
        try:
            sample(nvml)  # psutil's first cpu_percent(None) is 0.0: it measures from this call on
        except Exception:
            return
        while not self.stopped.wait(self.interval_s):
            try:
                values = sample(nvml)
            except Exception:  # a sampler is never worth a failed run
                continue
            stamp = int(time.time() * 1000)
            taken = [(self.prefix + key, value, self.step, stamp) for key, value in values.items()]
            self.step += 1
            if self.emit is not None:
                self.emit(taken)
            else:
                with self.lock:
                    self.pending.extend(taken)


def interval_s(env: Mapping[str, str]) -> float:
    """The sampling interval MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL asks for (0 = off; unreadable: the default)."""
    try:
        return float(env.get(INTERVAL_ENV) or DEFAULT_S)
    except ValueError:
        return DEFAULT_S


def gathered(tracking: str, env: Mapping[str, str] | None = None) -> bool:
    """Rank 0 asks: will this run be tracked with system metrics, so other hosts' samplers should run for it?

    Example:
        >>> gathered("mlflow", {INTERVAL_ENV: "5"}), gathered("none", {}), gathered("mlflow", {INTERVAL_ENV: "0"})
        (True, False, False)
    """
    env = os.environ if env is None else env
    return context.resolve(tracking, env) != "none" and interval_s(env) > 0


def start(emit: Callable[[list[Sample]], None] | None = None,
          env: Mapping[str, str] | None = None) -> SystemSampler | None:
    """A sampler on this host's local rank 0 (None elsewhere, or when the interval is 0).

    Example:
        >>> sampler = start(tracker.record_system)  # doctest: +SKIP
    """
    env = os.environ if env is None else env
    interval = interval_s(env)
    if interval <= 0 or process.current().local_rank != 0:
        return None
    return SystemSampler(interval, emit)
