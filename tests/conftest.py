"""Fixtures, hooks and plug-in wiring only: environment isolation, a real horovodrun launcher for multi-rank tests and
the reference runs several files compare against. What tests import lives in the `support` package beside this file."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.environ import LIBRARY_SET, PYTEST_OWN, EnvironmentLeak
from support.ordering import order_items, scheduler_by_group
from support.paths import PLUGINS, PLUGINS_DIR, ROOT
from support.processes import horovodrun, horovodrun_cmd, kill_tree, show
from support.runs import EQUIV, DefaultJob, final_weights

TIERS = ("unit", "one_rank", "multirank", "cluster")
# The Horovod build script lives outside the package (it runs before hvdtrain is installed); its parts
# (install_plan, install_toolchain, install_build) sit beside the patch series in scripts/horovod/.
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "scripts" / "horovod"))
# Plug-ins that tests name as 'module:function' (and import directly); rank-side scripts live in ranks/.
sys.path.insert(0, str(PLUGINS_DIR))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--order", default="as-collected", metavar="ORDER",
                     help="run the collected tests as-collected, reversed, or shuffled:SEED (a seeded shuffle of the "
                          "files, then of the tests inside each file): the suite must pass in any order")


@pytest.hookimpl(optionalhook=True)   # a pytest-xdist hook: pytest without xdist must not refuse it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under `--dist loadgroup`, one group per file and one for the cluster tier (support.ordering)."""
    return scheduler_by_group(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Markers by folder (tests/unit -> unit, tests/one_rank -> one_rank, ...), then the --order asked for (the xdist
    groups: pytest_xdist_make_scheduler)."""
    for item in items:
        tier = next((part for part in Path(str(item.fspath)).parts if part in TIERS), None)
        if tier:
            item.add_marker(getattr(pytest.mark, tier))
    order_items(items, config.getoption("order"))


@pytest.fixture(autouse=True)
def unit_tests_see_no_in_process_horovod(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit test is a function of its arguments: a Horovod that a one-rank test initialised earlier in this
    pytest process (any --order: reversed runs one_rank first) must not answer environment.process.current()
    in its place (it did: 4 unit tests failed in a shuffled run)."""
    if request.node.get_closest_marker("unit"):
        from hvdtrain.environment import process
        monkeypatch.setattr(process, "_HOROVOD", [])


@pytest.fixture(autouse=True)
def restore_environ(request: pytest.FixtureRequest):
    """Tests may set variables; none leaks into the next test. A change left behind is undone and reported as an
    EnvironmentLeak warning naming the test and the variables (use monkeypatch.setenv, or restore them)."""
    saved = dict(os.environ)
    yield
    changed = sorted(name for name in set(saved) | set(os.environ)
                     if saved.get(name) != os.environ.get(name) and name != PYTEST_OWN)
    if changed:
        own = os.environ.get(PYTEST_OWN)
        os.environ.clear()
        os.environ.update(saved)
        if own is not None:
            os.environ[PYTEST_OWN] = own
    if set(changed) - LIBRARY_SET:
        warnings.warn(EnvironmentLeak(f"{request.node.nodeid} left os.environ changed: {', '.join(changed)} "
                                      "(restored)"), stacklevel=1)


@pytest.fixture(scope="session")
def equiv_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference of the equivalence tests: EQUIV on one process with the global batch (32).

    Trained once per session (4 tests compare against it, ~4 s of CPU each); tests only read its folder.
    """
    run_dir = tmp_path_factory.mktemp("equiv")
    proc = subprocess.run([sys.executable, "-m", "hvdtrain", *EQUIV, "--batch-size", "32", "--run-dir", str(run_dir),
                           "--name", "one"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, show(proc)
    return run_dir / "one"


@pytest.fixture
def one_worker():
    """Horovod stays initialised across tests: after MPI_Finalize, MPI cannot start again in a process. The
    variables its start set in os.environ are given back after the test, as after any in-process run."""
    from hvdtrain.distributed import runtime

    with runtime.started() as world:
        yield world


@pytest.fixture(scope="session")
def default_job() -> Iterator[DefaultJob]:
    """The default job (digits, CNN, 10 epochs) under `horovodrun -np 2 --gloo`, one thread per worker: trained
    once per session (~30 s of CPU) for its accuracy test (Spark and Ray compare with a 2-epoch reference of their
    own: tests/cluster/test_spark.py). Tests only read its folder."""
    with tempfile.TemporaryDirectory(prefix="hvdtrain-default-job-") as run_dir:
        proc = horovodrun(2, ["-m", "hvdtrain", "--threads", "1", "--run-dir", run_dir, "--name", "default"], "gloo")
        assert proc.returncode == 0, show(proc)
        yield DefaultJob(Path(run_dir) / "default", proc.stdout)


@pytest.fixture
def background():
    """Start horovodrun in its own process group (like a terminal job); the group is killed at the end."""
    started: list[subprocess.Popen] = []

    def start(np: int, args: list[str], backend: str, log: Path, env: dict[str, str] | None = None):
        handle = log.open("w")
        proc = subprocess.Popen(horovodrun_cmd(np, args, backend), cwd=ROOT, stdout=handle,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))
        started.append(proc)
        return proc

    yield start
    for proc in started:
        kill_tree(proc, 9)


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., dict]:
    """The final weights of a job that never stopped, the reference every stop-and-resume test ends equal to:
    `uninterrupted(args, np=2, backend="gloo")` trains `horovodrun ... python ARGS` (plug-ins importable,
    FAULTS_SLEEP_S=0) once per session and xdist worker for each distinct job, and returns its model.pt."""
    done: dict[tuple, dict] = {}

    def weights(args: list[str], np: int = 2, backend: str = "gloo") -> dict:
        key = (tuple(args), np, backend)
        if key not in done:
            run_dir = tmp_path_factory.mktemp(f"uninterrupted-{backend}-{np}")
            proc = horovodrun(np, [*args, "--run-dir", str(run_dir), "--name", "ref"], backend,
                              env={**PLUGINS, "FAULTS_SLEEP_S": "0"})
            assert proc.returncode == 0, "the uninterrupted reference run failed:\n" + show(proc)
            done[key] = final_weights(run_dir / "ref")
        return done[key]

    return weights
