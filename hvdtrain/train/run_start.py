"""The start of a run: what `python -m hvdtrain` and a script of your own (its Trainer, or hvdtrain.fit) take alike
from the process and the scheduler before Horovod starts, once per process (issue 52: one code path; the CLI is one
more caller of prepare_run()).

- Credentials: the variables of the 0600 file HVDTRAIN_SECRETS_FILE names go into os.environ, and rank 0 warns of
  credentials that came on horovodrun's command line (launcher/worker_start.py's take_secrets; launcher/ sits above
  this layer, so the package root hands it down through use_secrets_reader()).
- Gloo over srun: a task of an srun step with no MPI and no horovodrun joins the step's Gloo world
  (train/slurm_gloo_join.py).
- Slurm's requeue defaults (cluster/slurm_requeue.py): inside a Slurm job the process's first run is named
  `slurm-<job id>` and, once the job was requeued, resumes (`resume="auto"`): a requeued job goes on by itself.
  Keys the user gave win: the CLI says which it was given; for a Trainer, a key set to other than its default
  counts as given. Later runs of the same process keep their config (two runs cannot share one folder).
- Stop signals (train/signals.py): SIGINT, SIGTERM and SIGUSR1 note a stop the ranks agree on (a checkpoint, then
  Stopped) while the run trains (RunSetup.stops(): the CLI's whole run, hvdtrain.fit's, each Trainer.fit()); the
  previous handlers come back after, even when it fails. A Stopped that ends a script prints the CLI's one line, not
  a traceback. `handle_signals=False` leaves the process's signals alone: a notebook keeps its own Ctrl-C, a program
  embedding hvdtrain its own handlers. Only the main thread can install handlers; elsewhere none are.

Then Horovod, torch's threads and the host memory (start_horovod(), every Trainer), and for hvdtrain.fit() Horovod
before the data loads (started()).
"""
from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

from hvdtrain.cluster.slurm_requeue import with_requeue_defaults
from hvdtrain.environment.process import is_rank_zero
from hvdtrain.errors import Stopped
from hvdtrain.output.console import console
from hvdtrain.train.signals import STOP

if TYPE_CHECKING:
    from hvdtrain.config.train_config import TrainConfig
    from hvdtrain.distributed.runtime import World

Environ = dict[str, str] | os._Environ[str]
# Loads HVDTRAIN_SECRETS_FILE into the environment it is given; returns a warning for rank 0, or None.
SecretsReader = Callable[[Environ], str | None]
ExceptHook = Callable[[type[BaseException], BaseException, TracebackType | None], object]


@dataclass(frozen=True)
class RunSetup:
    """What prepare_run() made of one run: its config, and whether it handles the stop signals (not inside another
    run: hvdtrain.fit's Trainer follows fit's choice)."""
    config: TrainConfig
    handle_signals: bool = True

    @contextmanager
    def stops(self) -> Iterator[None]:
        """The stop handlers for the block, a fresh request; the previous handlers back after it. Nothing where the
        run leaves signals alone, or handlers are in place already (the outer block gives them back)."""
        installed = self.handle_signals and STOP.install()
        try:
            yield
        finally:
            if installed:
                STOP.restore()


class ProcessStart:
    """What this process did once already (a fresh one per unit test: `ProcessStart(environ={...})`)."""

    def __init__(self, environ: Environ | None = None) -> None:
        self.environ = os.environ if environ is None else environ
        self.secrets_reader: SecretsReader | None = None
        self.secrets_taken = self.joined = self.ran = False
        self.inside = False     # hvdtrain.fit's run is open: its Trainer follows fit's handle_signals
        self.previous_hook: ExceptHook | None = None

    def prepare(self, config: TrainConfig, *, given: set[str] | None = None, handle_signals: bool = True) -> RunSetup:
        """Everything above, for a run of `config`; returns it with Slurm's defaults where they apply.

        Args:
            given: config keys the user set (the CLI's command line and --config file); default: the keys whose
                values differ from TrainConfig's defaults.
            handle_signals: stop handlers while the run trains; False for notebooks and programs that handle signals.
        """
        self.take_secrets()
        self.join_slurm_gloo()
        if not self.ran:   # the process's first run: a later one would want the same folder
            self.ran = True
            config, note = with_requeue_defaults(config, set(config.changed()) if given is None else given,
                                                 self.environ)
            if note:
                console.line(f"hvdtrain: {note}")
        if not handle_signals or self.inside:
            return RunSetup(config, handle_signals=False)
        if self.previous_hook is None and threading.current_thread() is threading.main_thread():
            self.previous_hook, sys.excepthook = sys.excepthook, self.excepthook
        return RunSetup(config)

    def take_secrets(self) -> None:
        """Before the run's own code: the credentials of HVDTRAIN_SECRETS_FILE, and rank 0's leak warning."""
        if self.secrets_taken or self.secrets_reader is None:
            return
        self.secrets_taken = True
        warning = self.secrets_reader(self.environ)
        if warning and is_rank_zero():   # once per job, not once per worker
            print(f"hvdtrain: {warning}", file=sys.stderr, flush=True)

    def join_slurm_gloo(self) -> None:
        """Horovod: srun's tasks with no MPI get Gloo's variables and rendezvous (before Horovod starts)."""
        if self.joined:
            return
        from hvdtrain.train.slurm_gloo_join import join  # its rendezvous server is Horovod's: loaded when joining only

        self.joined = True
        joined = join(self.environ)
        if joined and is_rank_zero():
            console.line(f"hvdtrain: {joined}")

    def excepthook(self, kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
        """A Stopped that nothing caught ends the program with the CLI's one line (exit status 1), not a traceback."""
        if isinstance(error, Stopped):
            console.error(str(error))
        elif self.previous_hook is not None:
            self.previous_hook(kind, error, trace)


PROCESS = ProcessStart()


def prepare_run(config: TrainConfig, *, given: set[str] | None = None, handle_signals: bool = True) -> RunSetup:
    """This process's ProcessStart.prepare(): see there."""
    return PROCESS.prepare(config, given=given, handle_signals=handle_signals)


def use_secrets_reader(reader: SecretsReader) -> None:
    """Called by the package root at import, with launcher/worker_start.py's take_secrets."""
    PROCESS.secrets_reader = reader


def start_horovod(config: TrainConfig) -> World:
    """Horovod (its timeline, autotune and stall check from `config`), then this worker's torch threads (a share of
    the host's cores unless config.threads) and the host memory kept between steps."""
    import torch

    from hvdtrain.distributed import horovod_settings as settings
    from hvdtrain.distributed import runtime
    from hvdtrain.train.device import threads_per_worker
    from hvdtrain.train.host_memory import keep_host_memory

    world = runtime.start(settings.horovod_env(config))
    torch.set_num_threads(config.threads or threads_per_worker(world.local_size))
    keep_host_memory(config.keep_host_memory)  # a step's tensors reuse the last step's pages
    return world


@contextmanager
def started(config: TrainConfig, handle_signals: bool = True) -> Iterator[tuple[TrainConfig, World]]:
    """hvdtrain.fit's start: prepare_run(), then Horovod before the data loads, so an elastic worker joining a running
    job is in the new world at once (the others wait for its data in the first sync, not in a rendezvous that gives up
    after --gloo-timeout-seconds). Yields the run's config and world, the stop handlers in place. When the block
    ends, the variables set in os.environ for it go back to the caller's (runtime.started), and the handlers too."""
    from hvdtrain.distributed import horovod_settings as settings  # only now: `import hvdtrain` loads no torch
    from hvdtrain.distributed import runtime

    setup = prepare_run(config, handle_signals=handle_signals)
    PROCESS.inside = True
    try:
        with setup.stops(), runtime.started(settings.horovod_env(setup.config)) as world:
            yield setup.config, world
    finally:
        PROCESS.inside = False


def report_crash(err: Exception) -> int:
    """A bug or a failure, not a user mistake: the traceback, then one line naming this rank."""
    import traceback

    from hvdtrain.environment.process import current
    from hvdtrain.errors import peer_failure_of
    from hvdtrain.output.console import console

    rank = current().rank  # Horovod's own rank when it got that far, else the launcher's
    if peer_failure_of(err):
        console.error(f"rank {rank} stopped because another rank failed ({err}); see that rank's error")
    else:
        traceback.print_exc()
        console.error(f"error: rank {rank} failed: {type(err).__name__}: {err}")
    return 1
