"""How a middleman of horovodrun stops its worker: Horovod 0.28.1's own way, without its two races.

horovodrun (Gloo, not elastic) starts each worker as `sh -c COMMAND` from a "middleman" process, which waits for
that shell with Popen.wait() and exits with its code. When the job stops (a worker failed, or horovodrun got
SIGTERM), each middleman runs safe_shell_exec.terminate_executor_shell_and_children(shell_pid): SIGTERM to the
shell's children, a wait of the grace for them, then SIGSTOP to the shell, SIGTERM to it, and psutil's wait for it.
Two races follow (docs/testing.md, seen on a loaded machine):

- A shell caught after its worker exited but before it exited itself is frozen by the SIGSTOP; a stopped process
  does not act on SIGTERM, so the wait runs the whole grace and the shell is SIGKILLed (a job held for 60 s
  after its workers wrote their stop checkpoints).
- psutil's wait reaps the shell, a child of the middleman, with waitpid. When it does so before the middleman's
  Popen.wait(), that call gets ECHILD and CPython reports returncode 0: horovodrun sees the worker end with 0
  and the job "succeeds".

stop_shell_and_children does the same steps without them: no SIGSTOP (SIGCONT goes with the shell's SIGTERM, in
case anything else stopped it), and the shell is only watched (its status polled), never waited for, so
Popen.wait() alone reaps it and reports its real code. SIGSTOP was there so the shell could not start a new
child meanwhile; horovodrun's command runs one program after a `cd`, and the shell's own SIGTERM follows at
once, so nothing is lost.
"""
from __future__ import annotations

import signal
import sys
import time

import psutil

POLL_S = 0.05


def install() -> None:
    """In horovodrun's process and its middlemen: stop_shell_and_children in place of Horovod's function. Under a
    Horovod other than the one it was written for, Horovod's own stays, with one line on stderr (a middleman that
    failed to import would fail the job)."""
    from hvdtrain.distributed import horovod_runner

    try:
        horovod_runner.replace_shell_termination(stop_shell_and_children)
    except horovod_runner.AdapterError as err:
        print(f"hvdtrain: note: {err}; Horovod's own stop of its workers stays", file=sys.stderr, flush=True)


def stop_shell_and_children(pid: int, grace_s: float) -> None:
    """SIGTERM the children of shell `pid`, give them `grace_s` to exit, SIGKILL what is left (with its
    descendants), then SIGTERM the shell and SIGKILL it if it has not ended `grace_s` later. Never waitpid()s the
    shell: its parent's Popen.wait() must be the one to reap it."""
    try:
        shell = psutil.Process(pid)
        children = shell.children()
    except psutil.NoSuchProcess:
        return
    for child in children:
        _signal(child, signal.SIGTERM)
    # The children are the shell's, not this process's: watched, not waited for. One that has exited but that its
    # shell has not reaped yet (a zombie: the shell may be stopped, or busy) counts as ended.
    _ended_within(children, grace_s)
    for child in children:
        if running(child):
            try:
                descendants = child.children(recursive=True)
            except psutil.NoSuchProcess:
                descendants = []
            for process in [*descendants, child]:
                _signal(process, signal.SIGKILL)
    _signal(shell, signal.SIGTERM)
    _signal(shell, signal.SIGCONT)
    if not _ended_within([shell], grace_s):
        _signal(shell, signal.SIGKILL)


def _signal(process: psutil.Process, signum: int) -> None:
    # psutil checks that the pid still names the same process (its start time), so a reused pid is never signalled.
    try:
        process.send_signal(signum)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass


def running(process: psutil.Process) -> bool:
    """Alive and not a zombie (one that exited and waits for its parent to reap it)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _ended_within(processes: list[psutil.Process], seconds: float) -> bool:
    """Whether every one of `processes` ended within `seconds`, by polling (never waitpid)."""
    deadline = time.monotonic() + seconds
    while any(running(process) for process in processes):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True
