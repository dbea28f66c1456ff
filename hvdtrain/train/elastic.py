"""Elastic training (horovodrun --min-np/--max-np, Gloo): everything it adds to the loop, in one place.

A component, as torchtitan's fault tolerance is: the Trainer hands it the model, the optimizer and a
`Loop` (the few public methods below) and calls `run` (instead of training directly) and `commit`.
Workers that join a running job make no collective call before the state's first sync, so rank 0's
run-directory verdict and checkpoint ride in the state (`start`), and each (re)start adopts them.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import torch

from hvdtrain.distributed import collectives, elastic_state, runtime
from hvdtrain.errors import UserError
from hvdtrain.output.console import console
from hvdtrain.output.run_directory import RunDirectory, Verdict
from hvdtrain.train import checkpoint
from hvdtrain.train.progress import Progress

# Set by `hvdtrain launch` to its --start-timeout: how long a job may wait below --min-np for hosts. Its
# driver ends the job then (launcher/elastic_driver.py), so workers wait as long as the world can form.
WAIT_ENV = "HVDTRAIN_ELASTIC_WAIT_S"
DEFAULT_WAIT_S = 120.0
# A normal recovery re-forms the world in seconds; still waiting after this, the old rank 0 saves the last commit.
SAVE_AFTER_S = 10.0
# Set by `hvdtrain launch`'s driver, which watches the slots.
WATCHED_ENV = "HVDTRAIN_ELASTIC_WATCHED"
# Under plain horovodrun (no WATCHED_ENV) nothing watches the slots, so each worker gives up on its own
# this long after the wait bound.
GIVE_UP_EXTRA_S = 30.0


class Loop(Protocol):
    """What the elastic component needs from the training loop (the Trainer provides it)."""

    def train_until(self, p: Progress, end_epoch: int) -> None:
        """Train from wherever `p` stands; calls `commit` along the way."""

    def start_run(self, found: dict[str, Any] | None, p: Progress, end_epoch: int) -> None:
        """Adopt rank 0's resumed checkpoint (raises its UserError)."""

    def resize(self, world: runtime.World) -> None:
        """Re-shard the data and rescale the LR for a new set of workers."""

    def zero_stats(self) -> torch.Tensor:
        """Empty metric sums in this run's layout."""

    def write_checkpoint(self, p: Progress, per_rank: list[tuple[Any, Any]], *, replace: bool = True) -> str | None:
        """Write `p` as rank 0 would, with each rank's (RNG state, metric sums); returns the path.
        replace=False: None, writing nothing, where this step's checkpoint exists or is being written."""


class ElasticRun:
    """Args:
        loop: the training loop to run elastically.
        run_dir: the run directory, whose verdict each (re)start adopts and whose lock follows rank 0.
        model, optimizer: what Horovod's state saves on commit and restores after a failure.
        start: {"plan": rank 0's run-dir Verdict (None elsewhere), "resume": what rank 0 read (or None)}.
    """

    def __init__(self, loop: Loop, run_dir: RunDirectory, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 start: dict[str, Any]) -> None:
        self.loop, self.run_dir = loop, run_dir
        self.model, self.optimizer = model, optimizer
        self.start = start
        self.rank = 0                       # for messages while the world re-forms (Horovod is down then)
        self.state: Any = None
        self._own_stats: Any = None
        self._final: Progress | None = None
        self._claim: Path | None = None     # this rank saves the last commit while waiting (see below)
        self.size = 0                       # workers at the last (re)start, to tell when some were lost
        # The timers' callbacks act only while the world is re-forming, and training waits for one that runs.
        self._reset_lock = threading.Lock()
        self._resetting = False

    def run(self, progress: Progress, end_epoch: int) -> Progress:
        """Train until end_epoch, surviving workers that leave or join; returns where training ended."""
        # Horovod's state saves references on commit, so it only ever holds copies of the progress.
        self.state = elastic_state.elastic_state(self.model, self.optimizer, progress=progress.copy(),
                                                 start=self.start)
        self.state.register_reset_callbacks([self._on_reset])
        elastic_state.run_elastic(self._attempt, while_resetting=self._waiting_for_world)(self.state, end_epoch)
        self.start = self.state.start
        assert self._final is not None
        return self._final

    def _attempt(self, state: Any, end_epoch: int) -> None:
        p = state.progress.copy()
        self._begin(p, end_epoch)
        self.loop.train_until(p, end_epoch)
        self._final = p

    def commit(self, p: Progress) -> None:
        """Save the state; Horovod may raise here to admit new hosts (then the loop restarts)."""
        self.state.progress = p.copy()
        self.state.commit()

    def _begin(self, p: Progress, end_epoch: int) -> None:
        """After every (re)start: act on what rank 0 decided before the first sync."""
        state = self.state
        plan, found = state.start["plan"], state.start["resume"]
        # Metric sums are per rank: a survivor keeps its own, a worker that just joined starts from zero.
        self._note_world()
        # On every rank at once (the verdict came by the sync); rank 0 may be another process than at the start.
        self.run_dir.adopt(plan or Verdict(), is_root=runtime.world().is_root)
        self._hold_run_dir(plan)
        p.stats = self._own_stats if self._own_stats is not None else self.loop.zero_stats()
        self._own_stats = None
        self.loop.start_run(found, p, end_epoch)
        if found is not None:
            state.start = {"plan": plan, "resume": None}  # once: a worker joining later takes the synced state
        # Horovod commits only in commit(): without this, a failure before the first commit would restore
        # each worker's own pre-sync weights (and a resumed run's progress without its weights).
        state.progress = p.copy()
        state.save()

    def _hold_run_dir(self, plan: Verdict | None) -> None:
        """The run folder stays locked while the job runs, whichever process is rank 0 now (output/claim.py):
        the first rank 0 claimed it; a later one takes the lock over from it (this job's, by the id in the
        file) once it lets go. A folder another run has taken meanwhile stops the job on every rank."""
        if not plan or not plan.path or not plan.job:
            return   # the same on every rank (the plan came with the sync): all make the broadcast, or none
        refused = self.run_dir.hold(runtime.world().is_root)   # held until the Trainer's close()
        # Horovod: one small broadcast per (re)start, so that every rank stops together on a refusal.
        refused = collectives.broadcast_object(refused, name="hvdtrain.run_dir_handover")
        if refused:
            raise UserError(refused)

    def _on_reset(self) -> None:
        """Workers joined or left: keep this rank's own sums, re-shard the rest of the epoch, rescale the LR."""
        # The sync that follows hands every rank rank 0's sums, which would count rank 0's share once per worker.
        self._own_stats = self.state.progress.stats
        world, committed = runtime.world(), self.state.progress
        lost = self.size - world.size   # joins at the same reset hide leaves: a lower bound
        if lost > 0 and committed.position and world.is_root:
            console.error(f"note: {lost} worker(s) left in epoch {committed.epoch + 1}: its train metrics leave out "
                          "their share of the samples so far (train_samples in metrics.jsonl says how many count)")
        self.loop.resize(world)

    def _note_world(self) -> None:
        world = runtime.world()
        self.rank, self.size = world.rank, world.size

    @contextmanager
    def _waiting_for_world(self) -> Iterator[None]:
        """Around Horovod's re-forming of the world: below --min-np it may never end (horovod#3494)."""
        wait_s = float(os.environ.get(WAIT_ENV) or DEFAULT_WAIT_S)
        timers = [threading.Timer(min(SAVE_AFTER_S, wait_s / 2), self._save_last_commit)]
        if not os.environ.get(WATCHED_ENV):   # else the driver ends the job if the world cannot form, and only then
            timers.append(threading.Timer(wait_s + GIVE_UP_EXTRA_S, self._give_up, args=(wait_s + GIVE_UP_EXTRA_S,)))
        self._resetting = True
        for timer in timers:
            timer.daemon = True
            timer.start()
        try:
            yield
        finally:
            for timer in timers:
                timer.cancel()
            with self._reset_lock:   # a save in progress finishes before training changes the weights
                self._resetting = False
            if self._claim is not None:
                self._claim.unlink(missing_ok=True)
                self._claim = None

    def _save_last_commit(self) -> None:
        with self._reset_lock:
            if self._resetting:
                self._save_while_waiting()

    def _save_while_waiting(self) -> None:
        """While no collective can run: one survivor, whichever claims it first, writes the last commit.

        Every survivor holds the same committed model, optimizer and progress (rank 0 may be the one lost);
        the claim is a file beside the checkpoints, which every rank reaches (the run directory is shared).
        """
        plan = self.state.start["plan"]     # rank 0's, since the first sync
        run_path = plan.path if plan else None
        if not run_path:
            return
        p = self.state.progress     # the committed copy: the restored weights match it
        folder = checkpoint.checkpoint_dir(run_path)
        claim = folder / f".last-commit-{p.step:09d}.claim"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            return
        self._claim = claim
        # This rank's RNG state and metric sums alone: the file reads as a one-worker run (see resume.py).
        path = self.loop.write_checkpoint(p, [(checkpoint.rng_state(), p.stats)], replace=False)
        if path is None:   # rank 0's, from all workers, is there or on its way: it holds more than ours
            console.error(f"note: rank {self.rank} left the last commit (step {p.step}) to rank 0's checkpoint")
            return
        console.error(f"note: the workers have not re-formed after {SAVE_AFTER_S:g} s; in case they never do, "
                      f"rank {self.rank} saved the last commit (step {p.step}) to {path}")

    def _give_up(self, waited_s: float) -> None:
        with self._reset_lock:
            if not self._resetting:
                return
        console.error(f"error: rank {self.rank}: no new set of workers within {waited_s:g} s "
                      "(fewer than --min-np left?); giving up; resume with --resume auto")
        os._exit(1)
