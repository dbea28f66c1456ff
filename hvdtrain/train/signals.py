"""Ctrl-C / SIGTERM / SIGUSR1: note the request; the loop stops at the next point all ranks agree on.

SIGUSR1 is a scheduler's early warning (Slurm's `--signal=USR1@T`, `scancel --signal=USR1`): the same
"checkpoint now and stop" as SIGTERM, sent while there is still time to write it.
"""
from __future__ import annotations

import signal
import sys
from types import FrameType


class StopRequest:
    def __init__(self) -> None:
        self.signum = 0

    def handle(self, signum: int, frame: FrameType | None) -> None:
        # A second Ctrl-C is a person who will not wait: stop now, without the final checkpoint. A repeated
        # TERM/USR1 is not: a scheduler sends them more than once (slurmstepd signals each task and srun
        # forwards the one it got), and its own KILL ends a run that overstays the grace.
        if self.signum and signum == signal.SIGINT:
            sys.exit(128 + signum)
        self.signum = max(self.signum, signum)   # TERM outranks USR1 outranks INT, as agreed_signal() does

    def install(self) -> None:
        """Only the CLI installs handlers; a notebook keeps its own Ctrl-C (interrupt kernel)."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, self.handle)


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
