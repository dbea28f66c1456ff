"""Elastic training (horovodrun --min-np/--max-np, Gloo): everything it adds to the loop, in one place.

The loop calls three things: `run` (instead of training directly), `begin` (after every start or
restart, inside Horovod's retry loop) and `commit`. Workers that join a running job make no
collective call before the state's first sync, so rank 0's run-directory verdict and checkpoint
ride in the state (`start`), and each restart adopts them here.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hvdtrain.distributed import dist
from hvdtrain.errors import UserError
from hvdtrain.train.progress import Progress
from hvdtrain.train.resume import apply_resume

if TYPE_CHECKING:
    from hvdtrain.train.trainer import Trainer


class ElasticRun:
    """Args:
        trainer: the Trainer whose loop runs elastically.
        start: {"plan": rank 0's run-dir verdict (None elsewhere), "resume": what rank 0 read (or None)}.
    """

    def __init__(self, trainer: Trainer, start: dict[str, Any]) -> None:
        self.trainer = trainer
        self.start = start
        self.state: Any = None
        self._own_stats: Any = None
        self._final: Progress | None = None

    def run(self, progress: Progress, end_epoch: int) -> Progress:
        """Train until end_epoch, surviving workers that leave or join; returns where training ended."""
        trainer = self.trainer
        # Horovod's state saves references on commit, so it only ever holds copies of the progress.
        self.state = dist.elastic_state(trainer.model, trainer.optimizer, progress=progress.copy(),
                                        start=self.start)
        self.state.register_reset_callbacks([self._on_reset])
        dist.run_elastic(self._attempt)(self.state, end_epoch)
        self.start = self.state.start
        assert self._final is not None
        return self._final

    def _attempt(self, state: Any, end_epoch: int) -> None:
        p = state.progress.copy()
        self._begin(p, end_epoch)
        self.trainer._train(p, end_epoch)
        self._final = p

    def commit(self, p: Progress) -> None:
        """Save the state; Horovod may raise here to admit new hosts (then the loop restarts)."""
        self.state.progress = p.copy()
        self.state.commit()

    def _begin(self, p: Progress, end_epoch: int) -> None:
        """After every (re)start: act on what rank 0 decided before the first sync."""
        trainer, state = self.trainer, self.state
        plan, found = state.start["plan"], state.start["resume"]
        # Metric sums are per rank: a survivor keeps its own, a worker that just joined starts from zero.
        p.stats = self._own_stats if self._own_stats is not None else trainer.metrics.zeros()
        self._own_stats = None
        if plan["error"]:
            raise UserError(plan["error"])        # on every rank at once: the verdict came by broadcast
        trainer.run_path = plan["path"]
        resumed = None
        if found is not None:
            resumed = apply_resume(found, p, trainer.world, trainer.scaler)
            state.start = {"plan": plan, "resume": None}  # once: a worker joining later takes the synced state
            trainer._check_work_left(p, end_epoch)
        trainer._open_log(resumed)            # rank 0 may be another process than at the start
        # Horovod commits only in commit(): without this, a failure before the first commit would restore
        # each worker's own pre-sync weights (and a resumed run's progress without its weights).
        state.progress = p.copy()
        state.save()

    def _on_reset(self) -> None:
        """Workers joined or left: keep this rank's own sums, re-shard the rest of the epoch, rescale the LR."""
        # The sync that follows hands every rank rank 0's sums, which would count rank 0's share once per worker.
        self._own_stats = self.state.progress.stats
        self.trainer._fit_to_world(dist.world())
