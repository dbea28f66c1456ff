"""Shared fixtures: environment isolation and a real horovodrun launcher for multi-rank tests."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# The Horovod build script lives outside the package (it runs before hvdtrain is installed); its parts
# (install_plan, install_toolchain, install_build) sit beside the patch series in scripts/horovod/.
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "scripts" / "horovod"))
# Plug-ins that tests name as 'module:function' (and import directly); rank-side scripts live in ranks/.
PLUGINS_DIR = ROOT / "tests" / "plugins"
sys.path.insert(0, str(PLUGINS_DIR))
# pytest's own variable, changed by it between phases: not a test's leak.
PYTEST_OWN = "PYTEST_CURRENT_TEST"
# Set by libraries in their own process the first time they are used (torch's inductor cache and its compiled
# code's tensor pointer, Intel OpenMP at import, MLflow's telemetry session): restored like any other, but not
# reported, since no test can avoid them.
LIBRARY_SET = {"TORCHINDUCTOR_CACHE_DIR", "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR", "KMP_DUPLICATE_LIB_OK",
               "KMP_INIT_AT_FORK", "_MLFLOW_TELEMETRY_SESSION_ID"}
TIERS = ("unit", "one_rank", "multirank", "cluster")
# A job small enough to compare weights across launches: 2 workers x batch b must equal 1 worker x 2b.
EQUIV = ["--dataset", "synthetic", "--synthetic-samples", "640", "--val-fraction", "0.2",
         "--synthetic-shape", "1,8,8", "--model", "mlp", "--hidden", "32", "--lr", "0.05",
         "--lr-scaling", "none", "--warmup-epochs", "0", "--max-steps", "12", "--log-interval", "4",
         "--threads", "1"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--order", default="as-collected", metavar="ORDER",
                     help="run the collected tests as-collected, reversed, or shuffled:SEED (a seeded shuffle of the "
                          "files, then of the tests inside each file): the suite must pass in any order")


def order_items(items: list[pytest.Item], order: str) -> None:
    """Reorder in place; a bad ORDER is a one-line usage error."""
    if order == "as-collected":
        return
    if order == "reversed":
        items.reverse()
        return
    kind, _, seed = order.partition(":")
    if kind != "shuffled" or not seed.isdigit():
        raise pytest.UsageError(f"--order {order!r}: use as-collected, reversed or shuffled:SEED (SEED an integer, "
                                "e.g. shuffled:38)")
    # Files are shuffled, then the tests inside each file (as pytest-randomly does): a module-scoped cluster is
    # still built once per file instead of once per interleaved test, and order bugs between files still show.
    rng = random.Random(int(seed))
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    groups = list(files.values())
    rng.shuffle(groups)
    for group in groups:
        rng.shuffle(group)
    items[:] = [item for group in groups for item in group]


def group_of(nodeid: str) -> str:
    """The group a test runs in under `pytest -n N --dist loadgroup` (make test TEST_WORKERS=2): its file, so
    module-scoped fixtures are built once; the whole cluster tier is one group, since its tests share fixed namespace
    addresses, the Slurm daemons and Ray's ports, and its timings assume no other cluster beside it.

    Example:
        >>> group_of("tests/cluster/test_ray.py::test_x"), group_of("tests/unit/test_a.py::test_y[1]")
        ('cluster', 'tests/unit/test_a.py')
    """
    path = nodeid.split("::")[0]
    return "cluster" if "cluster" in path.split("/") else path


@pytest.hookimpl(optionalhook=True)   # a pytest-xdist hook: pytest without xdist must not refuse it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under `--dist loadgroup`, the groups of group_of() by node id. pytest-xdist's own loadgroup reads the
    xdist_group markers and appends the group to each item's `_nodeid`, which pytest 9 no longer reads (node ids
    are `_id`): every test was scheduled alone, the cluster tier's tests two at a time. Its load-scope scheduler
    asks for a test's scope by node id, so that is where the groups are given here."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return ByGroup(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Markers by folder (tests/unit -> unit, tests/one_rank -> one_rank, ...), then the --order asked for (the xdist
    groups: pytest_xdist_make_scheduler)."""
    for item in items:
        tier = next((part for part in Path(str(item.fspath)).parts if part in TIERS), None)
        if tier:
            item.add_marker(getattr(pytest.mark, tier))
    order_items(items, config.getoption("order"))


class EnvironmentLeak(UserWarning):
    """A test changed os.environ and did not undo it (restored by the restore_environ fixture)."""


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


class DefaultJob(NamedTuple):
    run: Path            # its run folder: summary.json, metrics.jsonl, config.yaml...
    stdout: str

    def last_epoch(self) -> dict:
        records = [json.loads(line) for line in (self.run / "metrics.jsonl").read_text().splitlines()]
        return [r for r in records if r["kind"] == "epoch"][-1]


@pytest.fixture(scope="session")
def default_job() -> Iterator[DefaultJob]:
    """The default job (digits, CNN, 10 epochs) under `horovodrun -np 2 --gloo`, one thread per worker: trained
    once per session (~30 s of CPU) for its own accuracy test and as the reference Spark and Ray must equal.
    Tests only read its folder."""
    with tempfile.TemporaryDirectory(prefix="hvdtrain-default-job-") as run_dir:
        proc = horovodrun(2, ["-m", "hvdtrain", "--threads", "1", "--run-dir", run_dir, "--name", "default"], "gloo")
        assert proc.returncode == 0, show(proc)
        yield DefaultJob(Path(run_dir) / "default", proc.stdout)


def horovod_patched(variable: str) -> bool:
    """The installed Horovod's extension reads `variable`, i.e. carries the hvdtrain patch that adds it
    (scripts/horovod_perf.py); False without Horovod."""
    from hvdtrain.distributed import runtime

    if runtime.hvd is None:
        return False
    libs = Path(runtime.hvd.__file__).parent.glob("mpi_lib_v2*.so")
    return any(variable.encode() in lib.read_bytes() for lib in libs)


def horovodrun_cmd(np: int, args: list[str], backend: str) -> list[str]:
    return [str(BIN / "horovodrun"), "-np", str(np), "-H", f"localhost:{np}", f"--{backend}",
            "--start-timeout", "120", "--disable-cache", "--network-interfaces", "lo", sys.executable, *args]


def horovodrun(np: int, args: list[str], backend: str, timeout: int = 300,
               cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `horovodrun -np N -H localhost:N --gloo|--mpi python ARGS` for real."""
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run(horovodrun_cmd(np, args, backend), cwd=cwd or ROOT, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


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


def kill_tree(proc: subprocess.Popen, sig: int) -> None:
    """Signal horovodrun and every process it started (workers run in their own sessions), by PID."""
    import psutil

    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for member in family:
        try:
            member.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=30)
    proc.wait(timeout=30)


def show(proc: subprocess.CompletedProcess) -> str:
    """Every rank's output, for assertion messages."""
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"


BACKENDS = pytest.mark.parametrize("backend", ["gloo", "mpi"])


def load_docs_checks():
    """docs/_ext/hvdtrain_docs.py (the docs' own checks: flags, runnable blocks), loaded as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("hvdtrain_docs", ROOT / "docs" / "_ext" / "hvdtrain_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
