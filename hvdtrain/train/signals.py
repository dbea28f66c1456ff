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
