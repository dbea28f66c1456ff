"""The training loop: read it top to bottom. Lines that exist only for distribution say `# Horovod:`."""
from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hvdtrain.config.train_config import TrainConfig, to_yaml
from hvdtrain.data.datasets import build_data, check_fits, step_samples, steps_per_epoch
from hvdtrain.data.loader import build_loader
from hvdtrain.data.sharding import ShardSampler
from hvdtrain.distributed import dist
from hvdtrain.errors import Stopped, UserError
from hvdtrain.models.builtin import build_model
from hvdtrain.models.pipeline import place
from hvdtrain.output.history import History
from hvdtrain.output.run_dir import RunLog, plan_run_dir
from hvdtrain.train import checkpoint
from hvdtrain.train.components import autocast, check_precision, make_optimizer, make_scaler, pick_device, show_progress
from hvdtrain.train.early_stopping import improved, patience_exhausted
from hvdtrain.train.evaluation import batch_stats, evaluate, param_digest, predict, ratio
from hvdtrain.train.lr_schedule import lr_at, scaled_lr
from hvdtrain.train.resume import apply_resume, read_on_root, resume_state
from hvdtrain.train.signals import STOP


@dataclass
class Progress:
    """Where training stands; checkpoints and elastic commits save exactly this."""
    epoch: int = 0
    position: int = 0           # samples of this epoch's order processed by all ranks together
    step: int = 0               # optimizer steps since the run began (skipped ones included)
    fit_step: int = 0           # steps in the current fit() call; drives the LR schedule
    nonfinite: int = 0          # consecutive steps skipped for non-finite gradients
    skipped: int = 0            # all steps skipped for non-finite gradients
    stats: torch.Tensor = field(default_factory=lambda: torch.zeros(3, dtype=torch.float64))
    best: float = math.nan      # best value of config.monitor so far
    best_epoch: int = -1        # the epoch (0-based) that reached it; best.pt holds its weights

    FIELDS = ("epoch", "position", "step", "fit_step", "nonfinite", "skipped", "stats", "best", "best_epoch")

    def values(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.FIELDS}


class Trainer:
    """Data-parallel training of any model on any map-style dataset, on every Horovod worker.

    Args:
        model: the model; its initial weights are taken from rank 0 (or from the checkpoint resumed).
        train_data: a torch Dataset of (input, target) pairs with __len__.
        val_data: optional held-out Dataset, evaluated after every epoch.
        optimizer: optional optimizer over `model`'s parameters; default from `config`. Its learning
            rates are the one-worker rates, scaled by `config.lr_scaling`.
        loss_fn: `loss_fn(outputs, targets)`, mean over the batch; default cross-entropy.
        config: a TrainConfig (batch size, epochs, LR policy, run directory...); default TrainConfig().
    Example:
        >>> trainer = hvdtrain.Trainer(my_model, train_ds, val_ds, config=hvdtrain.load_config(epochs=5))
        >>> history = trainer.fit()
        >>> trainer.evaluate()["val_acc"], trainer.predict(val_ds).shape
    """

    def __init__(self, model: nn.Module, train_data: Any, val_data: Any = None, *,
                 optimizer: torch.optim.Optimizer | None = None,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                 config: TrainConfig | None = None) -> None:
        self.config = config = config or TrainConfig()
        self.world = world = dist.init(dist.horovod_env(config))  # Horovod: timeline, autotune, stall check
        # Each worker gets its share of this host's cores; oversubscription makes every rank slower.
        torch.set_num_threads(config.threads or max(1, (os.cpu_count() or 1) // world.local_size))
        # Horovod: with K stages this worker owns GPUs local_rank*K ... local_rank*K+K-1; inputs go to the first.
        self.device = pick_device(config.device, world.local_rank * config.stages)
        check_precision(config.precision, self.device)
        check_fits(len(train_data), world.size)
        if config.monitor and val_data is None:
            raise UserError(f"monitor {config.monitor} needs held-out data (val_data); drop --monitor")
        self.train_data, self.val_data = train_data, val_data
        # Horovod: with sync_bn, BatchNorm statistics come from the global batch, not each worker's shard.
        model = dist.convert_sync_bn(model) if config.sync_bn else model
        self.model = place(model, self.device, local_rank=world.local_rank, local_size=world.local_size,
                           stages=config.stages, split=config.stage_split, micro_batches=config.micro_batches)
        self.scaler = make_scaler(config.precision, self.device)
        self.loss_fn = loss_fn or nn.functional.cross_entropy
        optimizer = optimizer or make_optimizer(config, self.model)
        self.progress = Progress()
        # One-worker LRs as the user built them; a resumed optimizer state carries the scheduled ones.
        self.base_lrs = [group["lr"] for group in optimizer.param_groups]

        # Rank 0 decides the run directory and reads any checkpoint; every rank learns the verdict,
        # so none waits alone, and nothing is written before all input checks passed.
        plan = plan_run_dir(config) if world.is_root else None
        # Horovod's wrapper is a new optimizer object: state is loaded into it, not into the original.
        self.optimizer: Any = dist.wrap_optimizer(
            optimizer, self.model, accumulate=config.accumulate, compression=config.compression, op=config.op,
            gradient_predivide_factor=config.gradient_predivide_factor)
        self.steps_in_backward = dist.steps_in_backward(config.op)
        # The loss decides, not a pass over every gradient (that pass cost ~5% of an MLP step; see
        # benchmarks/README.md). fp16 keeps the gradient check: an overflow there leaves the loss finite.
        self.check_loss = bool(config.nonfinite_limit) and not self.steps_in_backward and self.scaler is None
        self.run_path: str | None = None
        self.log: RunLog | None = None
        if config.elastic:
            # Horovod elastic: a worker that joins a running job calls nothing collective before the
            # state's first sync, which is the only call the running workers make with it. So rank 0's
            # verdict and checkpoint ride in the elastic state (see _adopt_start), and no broadcast here.
            self._start: dict[str, Any] = {"plan": plan, "resume": None}
            self._own_stats: torch.Tensor | None = None
            if plan is not None and config.resume and not plan["error"]:  # rank 0 only
                # Weights and optimizer state now (the sync hands them to all); progress after the sync.
                self._start["resume"] = read_on_root(config, plan["path"], self.model, self.optimizer)
        else:
            plan = dist.broadcast_object(plan, name="run_dir_plan")
            if plan["error"]:
                raise UserError(plan["error"])
            self.run_path = plan["path"]
            resumed = resume_state(config, self.run_path, self.model, self.optimizer, self.progress, world,
                                   self.scaler)
            dist.broadcast_state(self.model, self.optimizer)   # Horovod: identical start everywhere
            self.log = RunLog(self.run_path, config) if world.is_root and self.run_path else None
            if self.log and resumed:
                print(f"hvdtrain: {resumed}", flush=True)

        self.sampler = ShardSampler(len(train_data), world.rank, world.size, seed=config.seed)
        self.loader = build_loader(train_data, self.sampler, config, world.rank, self.device)
        self._fit_to_world()
        self.history = History()
        self.after_epoch: Callable[[dict[str, Any]], bool] | None = None

    def fit(self, epochs: int | None = None, *, after_epoch: Callable[[dict[str, Any]], bool] | None = None
            ) -> History:
        """Train. The first call runs up to `epochs` (default config.epochs) epochs in all, continuing a
        resumed run; each later call trains that many more.

        Args:
            after_epoch: called on every rank after each finished epoch with that epoch's record
                (metrics, the same on every rank); returning True stops training there. Its answer
                must be the same on every rank (e.g. rank 0's verdict, broadcast).

        Returns:
            The History of the epochs trained (rank 0's metrics, the same on every rank).
        """
        config, p = self.config, self.progress
        self.after_epoch = after_epoch
        first_call = not self.history
        end_epoch = (epochs or config.epochs) + (0 if first_call else p.epoch)
        if not first_call:
            p.fit_step = 0      # a new LR schedule; the first call continues a resumed one
        start = time.perf_counter()
        if config.elastic:
            state = dist.elastic_state(self.model, self.optimizer, start=self._start, **p.values())
            state.register_reset_callbacks([lambda: self._on_reset(state)])
            dist.run_elastic(self._train)(state, end_epoch)
            for name in Progress.FIELDS:
                setattr(p, name, getattr(state, name))
            self._start = state.start
        else:
            self._check_work_left(p, end_epoch)
            self._announce()
            self._train(p, end_epoch)
        self._finish(time.perf_counter() - start)
        return self.history

    def _check_work_left(self, p: Any, end_epoch: int) -> None:
        config = self.config
        if (not p.position and p.epoch >= end_epoch) or (config.max_steps and p.step >= config.max_steps):
            raise UserError(f"nothing to do: the run already finished {p.epoch} of {end_epoch} epochs "
                            f"({p.step} steps); raise --epochs (or --max-steps) to train longer")

    def _announce(self) -> None:
        if self.log:
            print(f"hvdtrain: {self.world.size} worker(s), {len(self.train_data)} train / "
                  f"{len(self.val_data) if self.val_data is not None else 0} held-out samples, LR x"
                  f"{self.lr_scale:g} ({self.config.lr_scaling}), run dir {self.log.path}\n{to_yaml(self.config)}",
                  flush=True)

    def _adopt_start(self, p: Any, end_epoch: int) -> None:
        """Elastic, after every (re)start of the loop: act on what rank 0 decided before the first sync."""
        plan, found = p.start["plan"], p.start["resume"]
        # Metric sums are per rank: a survivor keeps its own, a worker that just joined starts from zero.
        p.stats = self._own_stats if self._own_stats is not None else torch.zeros(3, dtype=torch.float64)
        self._own_stats = None
        if plan["error"]:
            raise UserError(plan["error"])        # on every rank at once: the verdict came by broadcast
        self.run_path = plan["path"]
        resumed = None
        if found is not None:
            resumed = apply_resume(found, p, self.world, self.scaler)
            p.start = {"plan": plan, "resume": None}  # once: a worker joining later takes the synced state
            self._check_work_left(p, end_epoch)
        if self.world.is_root and self.log is None and self.run_path:
            self.log = RunLog(self.run_path, self.config)  # rank 0 may be another process than at the start
            self._announce()
            if resumed:
                print(f"hvdtrain: {resumed}", flush=True)
        # Horovod commits only in commit(): without this, a failure before the first commit would restore
        # each worker's own pre-sync weights (and a resumed run's progress without its weights).
        p.save()

    def _train(self, p: Any, end_epoch: int) -> None:
        """The loop. `p` is a Progress, or Horovod's elastic state with the same fields."""
        config = self.config
        if config.elastic:
            self._adopt_start(p, end_epoch)
        # Planned here, not once: after an elastic reset the same epochs take a different number of steps.
        done_this_epoch = -(-p.position // (config.batch_size * config.accumulate * self.world.size))
        todo = (end_epoch - p.epoch) * self.steps_per_epoch - done_this_epoch
        if config.max_steps:
            todo = min(todo, config.max_steps - p.step)
        total_steps = p.fit_step + todo
        warmup_steps = round(config.warmup_epochs * self.steps_per_epoch)
        bar = None
        if self.world.is_root and show_progress():
            from tqdm.auto import tqdm

            bar = tqdm(total=total_steps, initial=p.fit_step, unit="step", leave=False)
        self.model.train()
        lr_factor = 1.0
        while (p.epoch < end_epoch and not (config.max_steps and p.step >= config.max_steps)
               and not patience_exhausted(p.epoch, p.best_epoch, config.patience)):
            # Horovod: every rank shuffles alike (seed + epoch) and resumes at the same global position.
            self.sampler.set_epoch(p.epoch, start=p.position)
            shard_len, epoch_start, epoch_steps = len(self.sampler), time.perf_counter(), 0
            for micro, (inputs, targets) in enumerate(self.loader):
                if micro % config.accumulate == 0:         # a step's first micro-batch
                    lr_factor = lr_at(p.fit_step, 1.0, self.lr_scale, warmup_steps, total_steps, config.lr_decay)
                    for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
                        group["lr"] = base_lr * lr_factor
                    self.optimizer.zero_grad()  # torch 2.x sets grads to None (Horovod's wrapper takes no args)
                    step_stats = torch.zeros(3, dtype=torch.float64, device=self.device)
                inputs = inputs.to(self.device, non_blocking=True)
                targets = targets.to(self.device, non_blocking=True)
                with autocast(config.precision, self.device):
                    outputs = self.model(inputs)
                    loss = self.loss_fn(outputs, targets)
                # Each micro-batch weighs its share of the step's samples: K batches of b make one of K*b.
                weight = len(targets) / step_samples(micro, config.batch_size, config.accumulate, shard_len)
                share = loss if weight == 1.0 else loss * weight
                step_stats += batch_stats(loss.detach(), outputs.detach(), targets)
                last_micro = (micro + 1) % config.accumulate == 0 or micro + 1 == len(self.loader)
                # Horovod: a step's last backward starts the allreduces; earlier ones add up gradients locally.
                (self.scaler.scale(share) if self.scaler else share).backward()
                p.position += len(targets) * self.world.size
                if not last_micro:
                    continue                                # more micro-batches before this step
                loss_flag = None
                if self.check_loss:
                    # Horovod: non-finite loss on any rank -> skip on all; rides in the gradients' last allreduce.
                    loss_flag = dist.nonfinite_flag_async(step_stats[:1], "step_loss",
                                                          config.gradient_predivide_factor)
                if self._step(p, loss_flag):
                    p.stats = p.stats + step_stats.cpu()
                p.step += 1
                p.fit_step += 1
                epoch_steps += 1
                if bar:
                    bar.update()
                if p.step % config.log_interval == 0:
                    self._log_interval(p, lr_factor, bar)
                if config.checkpoint_steps and p.step % config.checkpoint_steps == 0:
                    self._checkpoint(p)
                if config.elastic and p.step % config.commit_steps == 0:
                    p.commit()                              # Horovod: may raise to admit new hosts
                if config.max_steps and p.step >= config.max_steps:
                    break
            finished_epoch = p.position >= len(self.train_data)
            self._end_epoch(p, lr_factor, time.perf_counter() - epoch_start, epoch_steps, bar)
            if finished_epoch and config.monitor:
                self._judge(p)
            if finished_epoch and self.after_epoch is not None and self.after_epoch(self.history[-1]):
                end_epoch = p.epoch + 1     # asked to stop: this epoch is the last
            if finished_epoch:
                p.epoch, p.position = p.epoch + 1, 0
                p.stats = torch.zeros(3, dtype=torch.float64)
            if finished_epoch and config.checkpoint_epochs and p.epoch % config.checkpoint_epochs == 0:
                self._checkpoint(p)
            if config.elastic:
                p.commit()
        if bar:
            bar.close()

    def _step(self, p: Any, loss_flag: Any) -> bool:
        """Apply the step's gradients, the same on every rank; False when skipped as non-finite."""
        if self.steps_in_backward:
            self.optimizer.step()                           # Horovod: combines the Adasum deltas from backward
            return True
        self.optimizer.synchronize()                        # Horovod: averaged gradients, equal on all ranks
        if self.scaler:
            self.scaler.unscale_(self.optimizer)            # Horovod: after the allreduce, so all ranks agree
            applied = self._gradients_finite(p)
        else:
            applied = loss_flag is None or self._finite(p, bool(torch.isfinite(dist.wait(loss_flag)).all()), "loss")
        if applied:
            with self.optimizer.skip_synchronize():
                if self.scaler:
                    self.scaler.step(self.optimizer)
                else:
                    self.optimizer.step()
        if self.scaler:
            self.scaler.update()                            # halve the loss scale after an overflow
        return applied

    def _gradients_finite(self, p: Any) -> bool:
        """fp16: the unscaled gradients decide (an overflow leaves the loss finite). They are identical on
        every rank after the allreduce, so every rank reaches the same verdict."""
        if not self.config.nonfinite_limit:
            return True
        grads = [param.grad for param in self.model.parameters() if param.grad is not None]
        # A tensor is finite iff its min and max are (NaN propagates through both): one read pass.
        extremes = [v for g in grads if g.numel() for v in torch.aminmax(g)]
        finite = not extremes or bool(torch.isfinite(torch.stack(extremes)).all())
        if not finite and self.scaler and self.scaler.get_scale() >= 1.0:
            p.skipped += 1
            return False  # fp16 overflow at a large loss scale: routine, the scaler halves the scale
        return self._finite(p, finite, "gradients")

    def _finite(self, p: Any, finite: bool, what: str) -> bool:
        """Count a non-finite step (the verdict is the same on every rank); abort after too many in a row."""
        if finite:
            p.nonfinite = 0
            return True
        p.skipped += 1
        p.nonfinite += 1
        limit = self.config.nonfinite_limit
        if p.nonfinite >= limit:
            verb = "was" if what == "loss" else "were"
            raise UserError(f"the {what} {verb} not finite for {limit} steps in a row (step {p.step + 1}, "
                            f"epoch {p.epoch + 1}); lower --lr, check the data for NaN/inf, or raise "
                            "--nonfinite-limit")
        return False

    def _log_interval(self, p: Any, lr_factor: float, bar: Any) -> None:
        # Horovod: one allreduce per log interval, not per step; it also carries any stop request.
        total = dist.allreduce_sum(torch.cat([p.stats, torch.tensor([float(STOP.signum)])]), name="train_stats")
        record = {"kind": "train", "epoch": p.epoch, "step": p.step, "lr": self.base_lrs[0] * lr_factor,
                  "loss": ratio(total[0], total[2]), "acc": ratio(total[1], total[2])}
        if self.log:
            self.log.metrics(record)
        if bar and record["loss"] is not None:
            bar.set_postfix(loss=f"{record['loss']:.4f}", refresh=False)
        if total[3] > 0:
            self._stop(p, int(total[3].item()) // self.world.size or int(total[3].item()))

    def _end_epoch(self, p: Any, lr_factor: float, seconds: float, steps: int, bar: Any) -> None:
        total = dist.allreduce_sum(torch.cat([p.stats, torch.tensor([float(STOP.signum)])]), name="epoch_stats")
        record = {"kind": "epoch", "epoch": p.epoch, "step": p.step, "lr": self.base_lrs[0] * lr_factor,
                  "train_loss": ratio(total[0], total[2]), "train_acc": ratio(total[1], total[2]),
                  **self.evaluate(), "samples_per_s": float(total[2].item()) / seconds, "epoch_time_s": seconds,
                  "step_time_s": seconds / steps if steps else None}
        if self.history and self.history[-1]["epoch"] == record["epoch"]:
            self.history[-1] = record  # elastic: the epoch's end was redone after a failure
        else:
            self.history.append(record)
        if self.log:
            self.log.epoch(record, bar)
        if total[3] > 0:
            self._stop(p, int(total[3].item()) // self.world.size or int(total[3].item()))

    def _judge(self, p: Any) -> None:
        """Best weights and early stopping on config.monitor, after each finished epoch."""
        value = self.history[-1].get(self.config.monitor)
        verdict = (improved(self.config.monitor, p.best, value), value) if self.world.is_root else None
        # Horovod: rank 0's verdict for all, so every rank stops at the same epoch.
        better, value = dist.broadcast_object(verdict, name="monitor")
        if better:
            p.best, p.best_epoch = value, p.epoch
            if self.log:
                self.log.best(self.model)

    def _stop(self, p: Any, signum: int) -> None:
        saved = self._checkpoint(p) if self.config.checkpoint_on_stop else None
        raise Stopped(signum, p.step, saved)

    def _checkpoint(self, p: Any) -> str | None:
        """A collective: every rank contributes its RNG state and metric sums; rank 0 writes."""
        if not self.run_path:
            return None
        per_rank = dist.allgather_object((checkpoint.rng_state(), p.stats), name="checkpoint_gather")
        path = None
        if self.world.is_root:
            progress = {name: getattr(p, name) for name in Progress.FIELDS if name != "stats"}
            path = checkpoint.save(checkpoint.checkpoint_dir(self.run_path), p.step, {
                "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "progress": progress, "world_size": self.world.size, "rng": [r for r, _ in per_rank],
                "stats": [s for _, s in per_rank], "config": self.config.to_dict(),
                **({"scaler": self.scaler.state_dict()} if self.scaler else {})}, self.config.keep_checkpoints)
        return str(path) if path else None

    def _on_reset(self, state: Any) -> None:
        """Elastic: workers joined or left. Re-shard the rest of the epoch and rescale the LR."""
        # This rank's own metric sums (restored to the last commit after a failure): the sync that
        # follows hands every rank rank 0's, which would count rank 0's share once per worker.
        self._own_stats = state.stats
        self.world = dist.world()
        self.sampler.reshard(self.world.rank, self.world.size)
        self._fit_to_world()

    def _fit_to_world(self) -> None:
        """What follows from the number of workers: set at the start and after every elastic resize."""
        size, config = self.world.size, self.config
        self.steps_per_epoch = steps_per_epoch(len(self.train_data), size, config.batch_size, config.accumulate)
        self.lr_scale = scaled_lr(1.0, size, config.lr_scaling)

    def _finish(self, wall: float) -> None:
        p = self.progress
        # Horovod: proof that every replica took the same steps and ended with the same weights.
        per_rank = dist.allgather_object((p.step, param_digest(self.model)), name="final_state")
        last = self.history[-1] if self.history else {}
        seen = sum(r["samples_per_s"] * r["epoch_time_s"] for r in self.history)
        self.history.summary = {**last, "kind": "summary", "epochs_run": len(self.history), "steps": p.step,
                                "skipped_steps": p.skipped, "workers": self.world.size,
                                "samples_per_s": seen / wall, "wall_time_s": wall,
                                "rank_steps": [s for s, _ in per_rank],
                                "param_digests": [d for _, d in per_rank], "run_dir": self.run_path}
        if self.config.monitor:
            self.history.summary.update(monitor=self.config.monitor, best=p.best, best_epoch=p.best_epoch,
                                        stopped_early=patience_exhausted(p.epoch, p.best_epoch, self.config.patience))
        if self.log:
            self.log.finish(self.history, self.model)

    def evaluate(self, data: Any = None) -> dict[str, Any]:
        """Loss and accuracy over `data` (default: the held-out set), each sample counted once."""
        data = self.val_data if data is None else data
        if data is None:
            return {}
        return evaluate(self.model, data, self.loss_fn, self.world, self.config.eval_batch_size, self.device)

    def predict(self, data: Any) -> torch.Tensor:
        """Model outputs for every sample of `data`, in order, on every rank (computed sharded)."""
        return predict(self.model, data, self.world, self.config.eval_batch_size, self.device)


def fit(config: TrainConfig) -> History:
    """Train the model and dataset named in `config` (built-ins or plug-ins) on every worker.

    Args:
        config: a TrainConfig, e.g. `hvdtrain.load_config("run.yaml", epochs=3)`.
    Returns:
        The History: per-epoch metrics, `.summary` (final metrics, throughput, run dir), `.plot()`.
    Example:
        >>> history = hvdtrain.fit(hvdtrain.load_config(model="mlp", epochs=5))
    """
    torch.manual_seed(config.seed)
    data = build_data(config)
    model = build_model(config, tuple(data.train[0][0].shape), data.num_classes)
    return Trainer(model, data.train, data.val, config=config).fit()
