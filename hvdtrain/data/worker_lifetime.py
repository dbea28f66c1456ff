"""Loader workers that end when the training process that started them ends, however it ends.

A DataLoader worker watches its parent and exits when the parent is gone (torch's ManagerWatchdog, which compares
os.getppid() with the pid it saw at start). Under the forkserver start method, hvdtrain's default, that parent is
the forkserver, not the training process; and the forkserver outlives the training process, since every worker
holds the pipe whose closing would tell the forkserver to exit. So a training process that is SIGKILLed (Horovod's
launcher after its grace, the OOM killer, `kill -9`) left its loader workers, and their copies of the data, running
for good on that host. StopWithTrainer, set as the workers' worker_init_fn, gives each worker a thread that waits on
a pidfd of the training process and ends the worker when it exits.
"""
from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable
from typing import Any


class StopWithTrainer:
    """worker_init_fn: end this loader worker when process `trainer_pid` ends, then run `then(worker_id)` (the
    user's own worker_init_fn, if any). Picklable, as forkserver and spawn need."""

    def __init__(self, trainer_pid: int, then: Callable[[int], Any] | None = None) -> None:
        self.trainer_pid, self.then = trainer_pid, then

    def __call__(self, worker_id: int) -> None:
        watch(self.trainer_pid)
        if self.then is not None:
            self.then(worker_id)


def watch(pid: int) -> None:
    """End this process (os._exit, as its parent is gone and nothing waits for its cleanup) when `pid` ends."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        os._exit(0)   # it ended before this worker started
    except (AttributeError, OSError):
        return        # no pidfd here (Linux < 5.3, other systems): torch's own watchdog is all there is
    threading.Thread(target=_exit_when_ended, args=(fd,), name="hvdtrain-trainer-watch", daemon=True).start()


def _exit_when_ended(fd: int) -> None:
    select.select([fd], [], [])   # a pidfd becomes readable when its process ends
    os._exit(0)
