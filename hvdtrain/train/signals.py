"""Ctrl-C / SIGTERM / SIGUSR1: note the request; the loop stops at the next point all ranks agree on.

SIGUSR1 is a scheduler's early warning (Slurm's `--signal=USR1@T`, `scancel --signal=USR1`): the same
"checkpoint now and stop" as SIGTERM, sent while there is still time to write it.

Who installs the handlers: train/run_start.py, while a run trains (`python -m hvdtrain`, hvdtrain.fit, a script's
Trainer.fit()), and gives the previous ones back after, unless told not to (`handle_signals=False`: a notebook keeps
its own Ctrl-C); `hvdtrain tune` itself. Python lets only the main thread install them: elsewhere nothing is.
"""
from __future__ import annotations

import signal
import sys
import threading
from types import FrameType
from typing import Any


class StopRequest:
    def __init__(self) -> None:
        self.signum = 0
        self.replaced: dict[int, Any] | None = None   # the handlers ours replaced, while ours are in place

    def handle(self, signum: int, frame: FrameType | None) -> None:
        # A second Ctrl-C is a person who will not wait: stop now, without the final checkpoint. A repeated
        # TERM/USR1 is not: a scheduler sends them more than once (slurmstepd signals each task and srun
        # forwards the one it got), and its own KILL ends a run that overstays the grace.
        if self.signum and signum == signal.SIGINT:
            sys.exit(128 + signum)
        self.signum = max(self.signum, signum)   # TERM outranks USR1 outranks INT, as agreed_signal() does

    def install(self) -> bool:
        """Note SIGINT, SIGTERM and SIGUSR1 from now on, a fresh request. Returns whether this call installed the
        handlers: False where they are in place already, or this is not the main thread (Python allows it nowhere
        else), so the caller that got True is the one to restore()."""
        if self.replaced is not None or threading.current_thread() is not threading.main_thread():
            return False
        self.replaced = {sig: signal.signal(sig, self.handle) for sig in STOP_SIGNALS}
        self.signum = 0
        return True

    def restore(self) -> None:
        """Put back the handlers install() replaced (a handler set outside Python: the default), and forget a
        request no loop acted on. Nothing where ours are not in place, or off the main thread."""
        if self.replaced is None or threading.current_thread() is not threading.main_thread():
            return
        for sig, handler in self.replaced.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        self.replaced, self.signum = None, 0


STOP = StopRequest()
# The signals a stop request can carry, in the order of the flags each rank contributes.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def stop_flags(signum: int) -> list[float]:
    """This rank's request as one flag per signal: summing flags over ranks loses nothing."""
    return [1.0 if signum == sig else 0.0 for sig in STOP_SIGNALS]


def agreed_signal(summed_flags: list[float]) -> int:
    """The signal every rank acts on, from the flags summed over ranks: 0 = go on.

    SIGTERM (the scheduler or kill) wins over SIGUSR1 (its early warning), which wins over SIGINT, when
    ranks got different ones.

    Example:
        >>> agreed_signal([0.0, 1.0, 0.0])   # SIGTERM on 1 of 2 ranks
        15
    """
    asked = [int(sig) for sig, count in zip(STOP_SIGNALS, summed_flags, strict=True) if count > 0]
    return max(asked, default=0)
