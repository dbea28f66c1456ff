"""Tier 1: launcher/shell_stop.py against real shells and workers, as a horovodrun middleman has them: this test
process plays the middleman (the shell's parent, which reaps it with Popen.wait), `sh -c 'cd ...; python ...'` the
shell, and a small Python program the worker."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil

from hvdtrain.launcher.shell_stop import install, running, stop_shell_and_children

# The worker says it is ready, then waits; on SIGTERM it does what the test names, then exits 143.
WORKER = """
import os, signal, sys, time
def on_term(signum, frame):
    if {stop_parent}:
        os.kill(os.getppid(), signal.SIGSTOP)   # leaves its shell frozen, as a SIGSTOP mid-exit would
    sys.exit(143)
signal.signal(signal.SIGTERM, signal.SIG_IGN if {ignore_term} else on_term)
print("ready", flush=True)
time.sleep(120)
"""


def start(stop_parent: bool = False, ignore_term: bool = False) -> tuple[subprocess.Popen, psutil.Process]:
    code = WORKER.format(stop_parent=stop_parent, ignore_term=ignore_term)
    # The shape of horovodrun's command: a `cd`, then the program, so the shell forks it rather than exec()ing it.
    shell = subprocess.Popen(["sh", "-c", f"cd / > /dev/null 2>&1 ; {sys.executable} -c '{code}'"],
                             stdout=subprocess.PIPE, text=True)
    assert shell.stdout.readline() == "ready\n"
    children = psutil.Process(shell.pid).children()
    assert len(children) == 1, children   # the worker, a child of the shell
    return shell, children[0]


def gone(process: psutil.Process) -> bool:
    """Ended: no such process, or a zombie its (possibly stopped) shell has not reaped yet."""
    return not running(process)


def finish(shell: subprocess.Popen) -> int:
    try:
        return shell.wait(timeout=30)
    finally:
        if shell.poll() is None:
            shell.kill()
            shell.wait()


def test_the_shell_is_left_for_its_parent_to_reap_with_the_workers_code():
    shell, worker = start()
    stop_shell_and_children(shell.pid, 10)
    assert gone(worker)
    assert finish(shell) == 143


def test_control_horovods_own_stop_reaps_the_shell_first_and_the_parent_reads_0():
    """Why hvdtrain replaces it: Horovod 0.28.1's function waitpid()s the shell itself, and Popen.wait() then gets
    ECHILD, which CPython reports as exit code 0 (a stopped job that "succeeded")."""
    from horovod.runner.common.util import safe_shell_exec

    shell, _ = start()
    safe_shell_exec.terminate_executor_shell_and_children(shell.pid)
    assert finish(shell) == 0


def test_a_shell_found_stopped_ends_at_once_not_after_the_grace():
    shell, worker = start(stop_parent=True)
    began = time.monotonic()
    stop_shell_and_children(shell.pid, 20)
    took = time.monotonic() - began
    assert gone(worker)
    assert finish(shell) == -signal.SIGTERM   # its own SIGTERM, delivered once SIGCONT let it run
    assert took < 10, f"{took:.1f} s: the stop waited out the 20 s grace"


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace():
    shell, worker = start(ignore_term=True)
    began = time.monotonic()
    stop_shell_and_children(shell.pid, 1)
    assert time.monotonic() - began >= 1
    worker.wait(timeout=10)   # the SIGKILL sent, it may take a moment to land
    assert finish(shell) != 0


def test_a_shell_already_reaped_is_no_error():
    shell, worker = start()
    worker.kill()
    assert finish(shell) == 128 + signal.SIGKILL
    stop_shell_and_children(shell.pid, 1)
    stop_shell_and_children(2**22 + 1, 1)   # above Linux's largest pid: never a process


def test_install_puts_hvdtrains_stop_in_horovods_place(monkeypatch):
    from horovod.runner.common.util import safe_shell_exec

    original = safe_shell_exec.terminate_executor_shell_and_children
    monkeypatch.setattr(safe_shell_exec, "terminate_executor_shell_and_children", original)   # restored after
    install()
    assert safe_shell_exec.terminate_executor_shell_and_children is not original
    shell, worker = start()
    safe_shell_exec.terminate_executor_shell_and_children(shell.pid)
    assert finish(shell) == 143   # Horovod's own would leave 0 here (the control above)


def test_under_another_horovod_install_keeps_horovods_own_and_says_so(monkeypatch, capsys):
    from horovod.runner.common.util import safe_shell_exec

    from hvdtrain.distributed import horovod_runner

    original = safe_shell_exec.terminate_executor_shell_and_children
    monkeypatch.setattr(horovod_runner, "WRITTEN_FOR", "0.27.0")
    install()
    assert safe_shell_exec.terminate_executor_shell_and_children is original
    assert "Horovod's own stop of its workers stays" in capsys.readouterr().err
