"""The one polling wait of the test suite: a test waits on what it can observe, never on a fixed sleep."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float, what: str = "the condition", every: float = 0.1) -> T:
    """Poll `predicate` until it returns something truthy and return that; fail the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)
