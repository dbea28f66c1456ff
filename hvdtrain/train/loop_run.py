"""How the loop is run, one concept in one home: in one go on a fixed set of workers (LocalRun), or elastically
(ElasticRun: horovodrun --min-np/--max-np, Gloo), with everything elastic training adds to the loop in one place.
Both read one settings section (ElasticSettings) and call the loop through the same hooks (LoopHooks).

A component, as torchtitan's fault tolerance is: the Trainer picks one, hands it the model, the optimizer and
`LoopHooks` (a few of its own methods) and calls `run` (instead of training directly), `commit` and `watching`.
Workers that join a running job make no collective call before the state's first sync, so rank 0's
run-directory verdict and checkpoint ride in the state (`start`), and each (re)start adopts them.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from hvdtrain.checkpoint import format as checkpoint
from hvdtrain.checkpoint.manager import Checkpointer
from hvdtrain.checkpoint.stateful import TrainingState
from hvdtrain.config.train_config import TrainConfig
from hvdtrain.distributed import collectives, driver_heartbeat, elastic_state, peer_watch, runtime
from hvdtrain.errors import UserError
from hvdtrain.output.console import console
from hvdtrain.output.run_directory import RunDirectory, Verdict
from hvdtrain.train.progress import Progress

# Set by `hvdtrain launch` to its --start-timeout: how long a job may wait below --min-np for hosts. Its
# driver ends the job then (launcher/elastic_driver.py), so workers wait as long as the world can form.
WAIT_ENV = "HVDTRAIN_ELASTIC_WAIT_S"
DEFAULT_WAIT_S = 120.0
# A normal recovery re-forms the world in seconds; still waiting after this, a survivor saves the last commit
# (at most half the wait bound; SAVE_AFTER_ENV sets it outright). `hvdtrain launch` also asks for it as it gives up.
SAVE_AFTER_S = 10.0
SAVE_AFTER_ENV = "HVDTRAIN_ELASTIC_SAVE_AFTER_S"
# Set by `hvdtrain launch`'s driver, which watches the slots.
WATCHED_ENV = "HVDTRAIN_ELASTIC_WATCHED"
# Under plain horovodrun (no WATCHED_ENV) nothing watches the slots, so each worker gives up on its own
# this long after the wait bound.
GIVE_UP_EXTRA_S = 30.0


@dataclass(frozen=True)
class ElasticSettings:
    """What running the loop reads of the config."""

    elastic: bool           # --elastic: ElasticRun, else LocalRun
    commit_steps: int       # an elastic commit every N steps (and at every epoch's end)
    peer_timeout_s: int     # a rank silent this long ends the job (LocalRun) or is dropped by the driver

    @classmethod
    def of(cls, config: TrainConfig) -> ElasticSettings:
        return cls(config.elastic, config.commit_steps, config.peer_timeout_s)


@dataclass(frozen=True)
class LoopHooks:
    """What running the loop needs from it (the Trainer hands these of its own methods)."""

    train: Callable[[Progress, int], None]       # from wherever the progress stands to end_epoch; commits on the way
    begin: Callable[[dict[str, Any] | None, Progress, int | None], None]   # adopt what rank 0 read to resume (or None)
    resize: Callable[[runtime.World], None]      # re-shard the data and rescale the LR for a new set of workers
    zero_stats: Callable[[], torch.Tensor]       # empty metric sums in this run's layout
    state: Callable[[Progress, bool], TrainingState]   # what a checkpoint of this progress holds (bool: loader RNG)
    check_work_left: Callable[[Progress, int], None]   # a UserError when a resumed run has nothing left to train


class LocalRun:
    """The loop in one go on a fixed set of workers; every rank watches every other (distributed/peer_watch.py).
    Args as ElasticRun's."""

    def __init__(self, settings: ElasticSettings, hooks: LoopHooks, run_dir: RunDirectory, checkpointer: Checkpointer,
                 model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.settings, self.hooks, self.run_dir, self.checkpointer = settings, hooks, run_dir, checkpointer
        self.model, self.optimizer = model, optimizer

    @staticmethod
    def claim_early(run_dir: RunDirectory, *, is_root: bool) -> None:
        """hvdtrain.fit, before the data loads: a run refused its folder stops before loading anything."""
        verdict = run_dir.decide() if is_root else None
        refused = collectives.broadcast_object(verdict and verdict.error, name="run_dir_claim")
        if refused:
            raise UserError(refused)

    def open(self, progress: Progress, *, is_root: bool) -> None:
        """Rank 0's run-directory verdict and resumed checkpoint, for every rank; then one start everywhere."""
        verdict = self.run_dir.decide() if is_root else None
        # Horovod: rank 0's verdict for all (a refusal raises on every rank alike).
        self.run_dir.adopt(collectives.broadcast_object(verdict, name="run_dir_plan"), is_root=is_root)
        self.hooks.begin(self.checkpointer.share_resume(self.run_dir.path, is_root=is_root), progress, None)
        collectives.broadcast_state(self.model, self.optimizer)   # Horovod: identical start everywhere

    def watching(self) -> AbstractContextManager[Any]:
        """Horovod: a host cut off or a frozen rank ends the job with one line naming it, never a hang."""
        return peer_watch.watching(self.settings.peer_timeout_s)

    def run(self, progress: Progress, end_epoch: int) -> Progress:
        self.hooks.check_work_left(progress, end_epoch)
        self.hooks.train(progress, end_epoch)
        return progress

    def commit(self, p: Progress, *, step: bool = False) -> None:
        """Nothing to commit: a failure ends the job (and --resume goes on from its checkpoint)."""


class ElasticRun:
    """Args:
        settings: ElasticSettings.of(config).
        hooks: the training loop's hooks.
        run_dir: the run directory, whose verdict each (re)start adopts and whose lock follows rank 0.
        checkpointer: writes the last commit while the world re-forms.
        model, optimizer: what Horovod's state saves on commit and restores after a failure.
    """

    def __init__(self, settings: ElasticSettings, hooks: LoopHooks, run_dir: RunDirectory, checkpointer: Checkpointer,
                 model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.settings, self.hooks, self.run_dir, self.checkpointer = settings, hooks, run_dir, checkpointer
        self.model, self.optimizer = model, optimizer
        # {"plan": rank 0's run-dir Verdict (None elsewhere), "resume": what rank 0 read (or None)}
        self.start: dict[str, Any] = {"plan": None, "resume": None}
        self.rank = 0                       # for messages while the world re-forms (Horovod is down then)
        self.state: Any = None
        self._own_stats: Any = None
        self._final: Progress | None = None
        self.size = 0                       # workers at the last (re)start, to tell when some were lost
        # The timers' callbacks act only while the world is re-forming, and training waits for one that runs.
        self._reset_lock = threading.Lock()
        self._resetting = False

    @staticmethod
    def claim_early(run_dir: RunDirectory, *, is_root: bool) -> None:
        """Nothing before the data loads: a joining worker makes no collective call before the first sync."""

    def open(self, progress: Progress, *, is_root: bool) -> None:
        """Horovod elastic: no collective call here (a joining worker makes none before the first sync), so rank
        0's verdict and checkpoint (its weights loaded now, its progress at the first start) ride in the state."""
        verdict = self.run_dir.decide() if is_root else None
        if verdict is not None and not verdict.error:
            self.start["resume"] = self.checkpointer.read_on_root(verdict.path)
        self.start["plan"] = verdict

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
        self.hooks.train(p, end_epoch)
        self._final = p

    def watching(self) -> AbstractContextManager[Any]:
        """Horovod: each worker beats to `hvdtrain launch`'s driver, which drops a silent one and goes on
        (launcher/worker_watch.py); ending a job below --min-np, the driver first asks for the last commit."""
        return driver_heartbeat.beating(self.settings.peer_timeout_s, on_save=self._save_on_request)

    def commit(self, p: Progress, *, step: bool = False) -> None:
        """Save the state at every epoch's end and every --commit-steps steps (`step`: called after a step);
        Horovod may raise here to admit new hosts (then the loop restarts)."""
        if step and p.step % self.settings.commit_steps:
            return
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
        p.stats = self._own_stats if self._own_stats is not None else self.hooks.zero_stats()
        self._own_stats = None
        self.hooks.begin(found, p, end_epoch)
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
        self.hooks.resize(world)

    def _note_world(self) -> None:
        world = runtime.world()
        self.rank, self.size = world.rank, world.size

    @contextmanager
    def _waiting_for_world(self) -> Iterator[None]:
        """Around Horovod's re-forming of the world: below --min-np it may never end (horovod#3494)."""
        wait_s = float(os.environ.get(WAIT_ENV) or DEFAULT_WAIT_S)
        save_after = float(os.environ.get(SAVE_AFTER_ENV) or min(SAVE_AFTER_S, wait_s / 2))
        timers = [threading.Timer(save_after, self._save_last_commit, args=(save_after,))]
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

    def _save_last_commit(self, waited_s: float) -> None:
        self._save_if_waiting(f"the workers have not re-formed after {waited_s:g} s; in case they never do")

    def _save_on_request(self) -> bool:
        """The driver is ending the job below --min-np. True once this rank has seen to the last commit; False
        while it is not waiting for the world (still in a collective that has yet to fail): asked again."""
        return self._save_if_waiting("the job stops below --min-np")

    def _save_if_waiting(self, why: str) -> bool:
        """True once the last commit is on disk (saved now, or already there); False while this rank is not
        waiting for the world (still in a collective): the driver asks again."""
        with self._reset_lock:
            return self._resetting and self._save_while_waiting(why)

    def _save_while_waiting(self, why: str) -> bool:
        """While no collective can run: each survivor that finds no checkpoint of the last commit writes one (the
        first to land wins; checkpoint.save_new). True when one is on disk afterwards.

        Every survivor holds the same committed model, optimizer and progress (rank 0 may be the one lost). No
        claim file decides who writes: a claim held by the lost or frozen rank, or left by a killed earlier run,
        would make every survivor answer "saved" with nothing on disk.
        """
        plan = self.state.start["plan"]     # rank 0's, since the first sync
        run_path = plan.path if plan else None
        if not run_path:
            return True    # a run without a folder: nothing to save
        p = self.state.progress     # the committed copy: the restored weights match it
        final = checkpoint.checkpoint_dir(run_path) / checkpoint.file_name(p.step, p.branch)
        if final.exists():
            return True
        # This rank's per-rank states alone (not the loader's RNG: training moved it on after the commit); the file
        # reads as a one-worker run (see checkpoint/resume.py).
        path = self.checkpointer.save(self.hooks.state(p, False), p.step, replace=False)
        if path is not None:
            console.error(f"note: {why}: rank {self.rank} saved the last commit (step {p.step}) to {path}")
        elif final.exists():   # another survivor's, or rank 0's all-worker file, landed first
            console.error(f"note: rank {self.rank} found the last commit (step {p.step}) saved already")
        return final.exists()

    def _give_up(self, waited_s: float) -> None:
        with self._reset_lock:
            if not self._resetting:
                return
        console.error(f"error: rank {self.rank}: no new set of workers within {waited_s:g} s "
                      "(fewer than --min-np left?); giving up; resume with --resume auto")
        os._exit(1)
