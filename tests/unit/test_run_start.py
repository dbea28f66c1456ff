"""The start of a run (train/run_start.py), the one path `python -m hvdtrain` and a script's Trainer share, without
Horovod: Slurm's requeue defaults for the process's first run only, the secrets file read once, the stop handlers
installed for a block and given back, and a Stopped shown in one line. Each test builds its own ProcessStart; the
handlers are the process's own (signal.getsignal before and after). On Slurm for real:
tests/cluster/test_slurm_own_script.py."""
from __future__ import annotations

import signal
import threading

import pytest

from hvdtrain.config.train_config import load_config
from hvdtrain.errors import Stopped
from hvdtrain.train.run_start import ProcessStart
from hvdtrain.train.signals import STOP, STOP_SIGNALS

REQUEUED = {"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "1"}


def handlers() -> list[object]:
    return [signal.getsignal(sig) for sig in STOP_SIGNALS]


@pytest.fixture
def no_hook_left(monkeypatch):
    """prepare() wraps sys.excepthook once per ProcessStart: give the process's own back after the test."""
    import sys

    monkeypatch.setattr(sys, "excepthook", sys.excepthook)


def test_a_requeued_slurm_job_names_and_resumes_its_first_run_only(no_hook_left):
    start = ProcessStart(environ=dict(REQUEUED))
    first = start.prepare(load_config(epochs=1)).config
    assert (first.name, first.resume) == ("slurm-42", "auto")
    again = start.prepare(load_config(epochs=1)).config       # a second run of the same process: its own folder
    assert (again.name, again.resume) == ("", "")


def test_what_a_script_set_wins_and_the_cli_says_what_it_was_given(no_hook_left):
    named = ProcessStart(environ=dict(REQUEUED)).prepare(load_config(name="mine")).config
    assert (named.name, named.resume) == ("mine", "auto")      # a set key is a given key
    # The CLI's `--resume ''` equals the default, so only the CLI can say it was given.
    cli = ProcessStart(environ=dict(REQUEUED)).prepare(load_config(), given={"resume"}).config
    assert (cli.name, cli.resume) == ("slurm-42", "")
    nothing = ProcessStart(environ={}).prepare(load_config()).config
    assert (nothing.name, nothing.resume) == ("", "")


def test_the_secrets_file_is_read_once_and_rank_zero_warns(capsys, no_hook_left):
    reads: list[dict] = []

    def reader(environ):
        reads.append(environ)
        environ["HF_TOKEN"] = "from-file"
        return "warning: HF_TOKEN reached the workers on horovodrun's command line"

    env = {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}
    start = ProcessStart(environ=env)
    start.secrets_reader = reader
    start.prepare(load_config(), handle_signals=False)
    start.prepare(load_config(), handle_signals=False)
    assert reads == [env] and env["HF_TOKEN"] == "from-file"
    assert capsys.readouterr().err.count("hvdtrain: warning: HF_TOKEN reached the workers") == 1


def test_stops_installs_the_handlers_for_the_block_and_gives_the_previous_back(no_hook_left):
    def mine(signum, frame):
        return None

    before = signal.signal(signal.SIGUSR1, mine)
    try:
        setup = ProcessStart(environ={}).prepare(load_config())
        with setup.stops():
            assert handlers() == [STOP.handle] * 3
            with setup.stops():        # nested (the CLI's block around fit's): the outer one gives them back
                signal.raise_signal(signal.SIGUSR1)
            assert handlers() == [STOP.handle] * 3 and STOP.signum == signal.SIGUSR1
        assert signal.getsignal(signal.SIGUSR1) is mine and STOP.signum == 0
        with pytest.raises(RuntimeError), setup.stops():    # a failing run gives them back too
            raise RuntimeError("a failed run")
        assert signal.getsignal(signal.SIGUSR1) is mine
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_handle_signals_false_and_other_threads_leave_the_handlers_alone(no_hook_left):
    before = handlers()
    with ProcessStart(environ={}).prepare(load_config(), handle_signals=False).stops():
        assert handlers() == before
    inside = ProcessStart(environ={})
    inside.inside = True                # hvdtrain.fit's Trainer: fit's own choice stands
    assert not inside.prepare(load_config()).handle_signals
    seen: list[list[object]] = []
    setup = ProcessStart(environ={}).prepare(load_config())

    def in_a_thread():
        with setup.stops():
            seen.append(handlers())

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert seen == [before] and handlers() == before


def test_a_stopped_that_ends_a_script_is_one_line_and_other_errors_keep_their_traceback(capsys, no_hook_left):
    import sys

    shown: list[BaseException] = []
    sys.excepthook = lambda kind, error, trace: shown.append(error)
    start = ProcessStart(environ={})
    start.prepare(load_config())
    stop = Stopped(signal.SIGUSR1, 12, "runs/x/checkpoints/ckpt-000000012.pt")
    sys.excepthook(Stopped, stop, None)
    assert capsys.readouterr().err == ("hvdtrain: stopped by SIGUSR1 at step 12; checkpoint "
                                       "runs/x/checkpoints/ckpt-000000012.pt\n")
    error = ValueError("a bug")
    sys.excepthook(ValueError, error, None)
    assert shown == [error]
