"""Ctrl-C / SIGTERM: note the request; the loop stops at the next point all ranks agree on."""
from __future__ import annotations

import signal
import sys
from types import FrameType


class StopRequest:
    def __init__(self) -> None:
        self.signum = 0

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum:  # a second signal: stop now, without the final checkpoint
            sys.exit(128 + signum)
        self.signum = signum

    def install(self) -> None:
        """Only the CLI installs handlers; a notebook keeps its own Ctrl-C (interrupt kernel)."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self.handle)


STOP = StopRequest()
# The signals a stop request can carry, in the order of the flags each rank contributes.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def stop_flags(signum: int) -> list[float]:
    """This rank's request as one flag per signal: summing flags over ranks loses nothing."""
    return [1.0 if signum == sig else 0.0 for sig in STOP_SIGNALS]


def agreed_signal(summed_flags: list[float]) -> int:
    """The signal every rank acts on, from the flags summed over ranks: 0 = go on.

    SIGTERM (the scheduler or kill) wins over SIGINT when ranks got different ones.

    Example:
        >>> agreed_signal([0.0, 1.0])   # SIGTERM on 1 of 2 ranks
        15
    """
    asked = [int(sig) for sig, count in zip(STOP_SIGNALS, summed_flags, strict=True) if count > 0]
    return max(asked, default=0)
