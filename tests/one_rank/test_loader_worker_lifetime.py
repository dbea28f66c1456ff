"""Tier 2: the training loader's worker processes end when their training process is SIGKILLed, under each start
method (data/worker_lifetime.py). Under forkserver, hvdtrain's default, they used to run on for good, and so did
the forkserver. A user's own worker_init_fn still runs in each worker. One CLI process per case, a few seconds."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from support.paths import ROOT
from support.waiting import wait_for

from hvdtrain.launcher.shell_stop import running

SCRIPT = """
import sys, time, torch
from pathlib import Path
from torch.utils.data import DataLoader, TensorDataset
from hvdtrain.data.loader import LoadingSettings, build_loader
from hvdtrain.data.user_loader import unwrap

def mark(worker_id):
    Path(sys.argv[2], f"init-{worker_id}").touch()

if __name__ == "__main__":
    data = TensorDataset(torch.arange(64.0).view(-1, 1))
    dataset, user = unwrap(DataLoader(data, batch_size=4, num_workers=2, worker_init_fn=mark,
                                      multiprocessing_context=sys.argv[1], persistent_workers=True))
    settings = LoadingSettings(seed=1, batch_size=4, workers=2, prefetch_factor=2, persistent_workers=True,
                               mp_context=sys.argv[1])
    batches = iter(build_loader(dataset, None, settings, 0, torch.device("cpu"), user))
    next(batches)
    print(" ".join(str(worker.pid) for worker in batches._workers), flush=True)
    time.sleep(300)
"""


@pytest.mark.parametrize("start_method", ["forkserver", "spawn", "fork"])
def test_loader_workers_end_with_a_sigkilled_training_process(tmp_path: Path, start_method: str):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), start_method, str(tmp_path)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    workers: list[psutil.Process] = []
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 120)   # torch imports in three processes: slow when busy
        line = proc.stdout.readline() if ready else ""
        assert line.strip(), proc.stderr.read()[-3000:] if proc.poll() is not None else "no worker pids in 120 s"
        workers = [psutil.Process(int(pid)) for pid in line.split()]
        assert len(workers) == 2 and all(worker.is_running() for worker in workers)
        # worker 1 may start after batch 0
        wait_for(lambda: len(list(tmp_path.glob("init-*"))) == 2, 60, "both loader workers' init files")
        assert sorted(p.name for p in tmp_path.glob("init-*")) == ["init-0", "init-1"]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        wait_for(lambda: not any(running(worker) for worker in workers), 20,
                 f"the loader workers to end with the SIGKILLed trainer ({start_method})")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for worker in workers:   # only this test's own workers, by pid and start time
            if running(worker):
                worker.kill()
