"""The end-of-job race of Horovod 0.28.1's elastic driver, on its real ElasticDriver and worker registry (issue 36
item 11): workers are threads standing in for processes, the rendezvous server a stand-in.

A survivor that entered a new rendezvous (READY) just as the others finished (SUCCESS) is terminated by the
driver's stop; Horovod counts its exit as the job's result. hvdtrain's driver wrapper (EndInSuccess) does not.
"""
from __future__ import annotations

import threading
import time

import pytest

from hvdtrain.distributed import horovod_runner
from hvdtrain.launcher.elastic_driver import EndInSuccess

pytest.importorskip("horovod.runner.elastic.driver")
from horovod.runner.elastic.discovery import FixedHosts  # noqa: E402
from horovod.runner.elastic.driver import ElasticDriver  # noqa: E402

TERMINATED = 255   # what a worker ended over ssh by the driver's stop exits with


class Rendezvous:
    """What the driver calls on Horovod's rendezvous server."""

    def init(self, host_assignments: list) -> None:
        pass

    def stop(self) -> None:
        pass


def run_job(worker, wrap: bool) -> tuple[dict[str, tuple[int, float]], str | None, EndInSuccess | None]:
    """Three one-slot hosts; `worker(driver, slot_info, events)` is each worker's life; the job's results."""
    driver = ElasticDriver(Rendezvous(), FixedHosts({"host1": 1, "host2": 1, "host3": 1}), min_num_proc=2,
                           max_num_proc=3, timeout=30)
    forgiving = None
    if wrap:   # as elastic_driver.main installs it, through the adapter
        view = horovod_runner.DriverView(driver)
        installed: list[EndInSuccess] = []
        view.wrap_worker_exit(lambda handle: installed.append(EndInSuccess(view, handle)) or installed[-1])
        forgiving = installed[0]
    try:
        driver.start(3, lambda slot_info, events: worker(driver, slot_info, events))
        results = driver.get_results()
    finally:
        driver.stop()
    return results.worker_results, results.error_message, forgiving


def ready_when_the_others_succeed(driver, slot_info, events):
    """host3 asks for its next rank (Horovod's rendezvous handler records it READY and blocks until the round is
    complete), then runs until the driver's stop terminates it; the others finish training."""
    if slot_info.hostname == "host3":
        threading.Thread(target=driver.record_ready, args=("host3", 0), daemon=True).start()
        while not any(event.is_set() for event in events):
            time.sleep(0.01)
        return TERMINATED, time.time()
    time.sleep(0.3)
    return 0, time.time()


def test_horovod_alone_counts_the_worker_its_stop_terminated_as_the_jobs_failure():
    results, error, _ = run_job(ready_when_the_others_succeed, wrap=False)
    assert error is None
    assert results["host3[0]"][0] == TERMINATED   # the race as Horovod 0.28.1 has it: the job would exit 1


def test_a_worker_terminated_by_the_stop_after_success_is_not_a_failure(capsys):
    results, error, forgiving = run_job(ready_when_the_others_succeed, wrap=True)
    assert error is None
    assert {name: code for name, (code, _) in results.items()} == {"host1[0]": 0, "host2[0]": 0, "host3[0]": 0}
    assert forgiving is not None and forgiving.forgiven == ["host3[0]"]
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hvdtrain: note:")]
    assert len(notes) == 1 and "host3[0]" in notes[0] and f"exit {TERMINATED}" in notes[0], notes


def failed_while_the_others_succeed(driver, slot_info, events):
    """host3's worker fails for real in the last round (before the round completes); the others succeed."""
    if slot_info.hostname == "host3":
        return 1, time.time()
    time.sleep(0.3)
    return 0, time.time()


def test_a_worker_that_failed_in_the_last_round_still_fails_the_job():
    results, _, forgiving = run_job(failed_while_the_others_succeed, wrap=True)
    assert results["host3[0]"][0] == 1
    assert forgiving is not None and forgiving.forgiven == []
