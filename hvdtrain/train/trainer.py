"""The training loop: read it top to bottom. Lines that exist only for distribution say `# Horovod:`."""
from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import torch
from torch import nn

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.data.datasets import build_data, input_shape
from hvdtrain.data.fingerprint import fingerprint
from hvdtrain.data.loader import build_loader
from hvdtrain.data.shard_source import ShardSource
from hvdtrain.data.sharding import ShardSampler, check_fits, step_samples, steps_per_epoch
from hvdtrain.data.streaming import stream_source
from hvdtrain.data.user_loader import prepare, unwrap
from hvdtrain.distributed import collectives, driver_heartbeat, gradients, peer_watch, runtime, settings, sync_bn
from hvdtrain.errors import Stopped, UserError
from hvdtrain.models.builtin import build_model
from hvdtrain.models.compiled import compile_model
from hvdtrain.models.pipeline import place
from hvdtrain.output.console import banner_lines, console
from hvdtrain.output.history import History
from hvdtrain.output.plain_weights import plain_state_dict
from hvdtrain.output.run_directory import RunDirectory, RunDirSettings
from hvdtrain.train import checkpoint
from hvdtrain.train.batch import to_device
from hvdtrain.train.device import pick_device, threads_per_worker
from hvdtrain.train.early_stopping import improved, patience_exhausted
from hvdtrain.train.elastic import ElasticRun
from hvdtrain.train.evaluation import Collate, evaluate, param_digest, predict, probe_batch
from hvdtrain.train.host_memory import keep_host_memory
from hvdtrain.train.lr_schedule import lr_at, scaled_lr
from hvdtrain.train.metrics import BatchParts, Metric, MetricSet, choose
from hvdtrain.train.nonfinite import count_nonfinite, gradients_finite
from hvdtrain.train.optim import make_optimizer
from hvdtrain.train.precision import autocast, check_precision, make_scaler
from hvdtrain.train.progress import Progress
from hvdtrain.train.resume import apply_resume, read_on_root
from hvdtrain.train.signals import STOP, STOP_SIGNALS, agreed_signal, stop_flags
from hvdtrain.train.step import LossFn, StepFn, check_step, default_loss, labels_in_range, run_step

AfterEpoch = Callable[[dict[str, Any]], bool]


class Trainer:
    """Data-parallel training of any model on any dataset, on every Horovod worker.

    Args:
        model: the model; its initial weights are taken from rank 0 (or from the checkpoint resumed).
        train_data: a map-style Dataset, a DataLoader over one (its batch size, collate_fn, workers and
            shuffle are kept; only its sampler becomes each rank's shard), or a stream (hvdtrain's
            ParquetStream, or hvdtrain.data.streams.Stream around a Hugging Face/webdataset stream).
            Items may be (inputs, targets) pairs, dicts for `model(**batch)` (a model that returns its own
            `loss`, the Hugging Face convention), or any structure of tensors with step_fn.
        val_data: optional held-out Dataset or DataLoader, evaluated after every epoch.
        optimizer: optional optimizer over `model`'s parameters; default from `config`. Its learning
            rates are the one-worker rates, scaled by `config.lr_scaling`.
        loss_fn: `loss_fn(outputs, targets)`, mean over the batch; default cross-entropy. Outputs may
            be any structure (e.g. `(logits, aux)`) that your loss_fn takes.
        step_fn: `step_fn(model, batch) -> loss` or `-> (loss, {"name": value})`, for anything the
            default steps cannot express (several losses, extra values to report).
        metrics: names (acc, top5_acc, mse, mae) or metric objects (see train/metrics.py); default from
            `config.metrics` ("auto": accuracy for class labels, MSE/MAE for real-valued targets).
        config: a TrainConfig (batch size, epochs, LR policy, run directory...); default TrainConfig().
        collate_fn: turns a list of samples into a batch (e.g. padding), for a Dataset; default torch's
            (or `config.collate_fn`, or the DataLoader's own).
        run_directory: the run folder already decided on rank 0 (hvdtrain.fit claims it before the data
            loads); default: decided here. `close()` (or `with Trainer(...)`) gives it back.
    Example:
        >>> with hvdtrain.Trainer(my_model, train_ds, val_ds, config=hvdtrain.load_config(epochs=5)) as trainer:
        ...     history = trainer.fit()
        ...     trainer.evaluate()["val_acc"], trainer.predict(val_ds).shape
    """

    resumed = False     # from a checkpoint: its epoch records may repeat some already in metrics.jsonl

    def __init__(self, model: nn.Module, train_data: Any, val_data: Any = None, *,
                 optimizer: torch.optim.Optimizer | None = None, loss_fn: LossFn | None = None,
                 step_fn: StepFn | None = None, metrics: Sequence[str | Metric] | None = None,
                 config: TrainConfig | None = None, collate_fn: Collate | None = None,
                 run_directory: RunDirectory | None = None) -> None:
        config = config or TrainConfig()
        data = prepare(train_data, val_data, collate_fn, config.collate_fn, config.batch_size)
        train_data, val_data, self.loading = data.train, data.val, data.settings
        if self.loading is not None and self.loading.batch_size != config.batch_size:
            config = dataclasses.replace(config, batch_size=self.loading.batch_size)  # the user's DataLoader's
        self.config = config
        self.val_collate, self.eval_batch_size = data.val_collate, data.val_batch_size or config.eval_batch_size
        world = runtime.init(settings.horovod_env(config))  # Horovod: timeline, autotune, stall check
        torch.set_num_threads(config.threads or threads_per_worker(world.local_size))
        keep_host_memory(config.keep_host_memory)  # a step's tensors reuse the last step's pages
        # Horovod: with K stages this worker owns GPUs local_rank*K ... local_rank*K+K-1; inputs go to the first.
        self.device = pick_device(config.device, world.local_rank, local_size=world.local_size, stages=config.stages)
        check_precision(config.precision, self.device)
        stream = stream_source(train_data, elastic=config.elastic)
        check_fits(len(train_data), world.size)
        if config.monitor and val_data is None:
            raise UserError(f"monitor {config.monitor} needs held-out data (val_data); drop --monitor")
        self.train_data, self.val_data = train_data, val_data
        # Horovod: with sync_bn, BatchNorm statistics come from the global batch, not each worker's shard.
        model = sync_bn.convert_sync_bn(model) if config.sync_bn else model
        self.model = place(model, self.device, stages=config.stages, split=config.stage_split,
                           micro_batches=config.micro_batches)
        if config.compile:  # after placement: compiled for the device it runs on
            self.model = compile_model(self.model)
        self.step_fn = step_fn
        first = probe_batch(train_data, max(2, config.micro_batches), self.loading.collate_fn if self.loading else None)
        self.loss_fn: LossFn = loss_fn or default_loss(config.loss, first)
        self.float_buffers = [] if config.sync_bn else [
            b for b in self.model.buffers() if b.is_floating_point()]
        self.metrics = self._check_first_batch(first, metrics)
        self.scaler = make_scaler(config.precision, self.device)
        optimizer = optimizer or make_optimizer(config, self.model)
        self.progress = Progress(stats=self.metrics.zeros())
        # One-worker LRs as the user built them; a resumed optimizer state carries the scheduled ones.
        self.base_lrs = [group["lr"] for group in optimizer.param_groups]
        # Horovod's wrapper is a new optimizer object: state is loaded into it, not into the original.
        self.optimizer: Any = gradients.wrap_optimizer(
            optimizer, self.model, accumulate=config.accumulate, compression=config.compression, op=config.op,
            gradient_predivide_factor=config.gradient_predivide_factor)
        self.steps_in_backward = gradients.steps_in_backward(config.op)
        # The loss decides, not a pass over every gradient (that pass cost ~5% of an MLP step; see
        # benchmarks/README.md). fp16 keeps the gradient check: an overflow there leaves the loss finite.
        self.check_loss = bool(config.nonfinite_limit) and not self.steps_in_backward and self.scaler is None
        self.announced = False          # the banner is shown once per process (elastic restarts call again)
        self.world = world
        loading = self.loading
        # What this rank reads: a stream shards itself; a map-style dataset is read through a ShardSampler.
        self.source: ShardSource = stream or ShardSampler(
            len(train_data), world.rank, world.size, seed=config.seed, shuffle=loading.shuffle if loading else True,
            drop_last_batch=config.batch_size if loading and loading.drop_last else 0)
        self.loader = build_loader(train_data, None if stream else self.source, config, world.rank,
                                   self.device, loading)
        self.loader_rng_at_epoch = self.loader.generator.get_state()
        self.resize(world)
        self.history = History()
        self.after_epoch: AfterEpoch | None = None
        self.samples_this_fit = 0       # trained by all ranks in the current fit() call (its samples/s)
        self.elastic: ElasticRun | None = None
        self.run = run_directory or RunDirectory(RunDirSettings.of(config))
        # The config it writes is this one (a user's DataLoader may have set the batch size).
        self.run.settings = dataclasses.replace(self.run.settings, record=config)
        try:
            self._open_run()
        except BaseException:
            if run_directory is None:   # a caller's run directory is the caller's to close
                self.run.close()
            raise

    def _open_run(self) -> None:
        """Rank 0 decides the run directory and reads any checkpoint; every rank learns the verdict,
        so none waits alone, and nothing is written before all input checks passed."""
        config, world = self.config, self.world
        verdict = self.run.decide() if world.is_root else None
        if config.elastic:
            # Horovod elastic: no collective call here (a joining worker makes none before the first sync).
            start: dict[str, Any] = {"plan": verdict, "resume": None}
            if verdict is not None and config.resume and not verdict.error:  # rank 0: weights now, progress later
                start["resume"] = read_on_root(config, verdict.path, self.model, self.optimizer,
                                               self.data_fingerprint)
            self.elastic = ElasticRun(self, self.run, self.model, self.optimizer, start)
        else:
            # Horovod: rank 0's verdict for all (a refusal raises on every rank alike).
            self.run.adopt(collectives.broadcast_object(verdict, name="run_dir_plan"), is_root=world.is_root)
            found = None
            if config.resume:
                found = (read_on_root(config, self.run.path, self.model, self.optimizer, self.data_fingerprint)
                         if world.is_root else None)
                found = collectives.broadcast_object(found, name="resume")
            self.start_run(found, self.progress)
            collectives.broadcast_state(self.model, self.optimizer)   # Horovod: identical start everywhere

    def _check_first_batch(self, batch: Any, metrics: Sequence[str | Metric] | None) -> MetricSet:
        """One step on a small batch, before anything is written: an unsupported batch, output, loss or
        metric is a one-line UserError on every rank alike. Returns the metrics' layout."""
        config = self.config
        with checkpoint.rng_preserved(), torch.no_grad(), autocast(config.precision, self.device):
            self.model.eval()
            try:
                out = check_step(self.model, to_device(batch, self.device), self.loss_fn, self.step_fn)
            finally:
                self.model.train()
        names = [m.strip() for m in config.metrics.split(",") if m.strip()] if metrics is None else list(metrics)
        layout = choose(names, out.outputs, out.targets, sorted(out.extras), default_step=self.step_fn is None)
        layout.check_monitor(config.monitor)
        return layout

    def fit(self, epochs: int | None = None, *, after_epoch: AfterEpoch | None = None) -> History:
        """Train. The first call runs up to `epochs` (default config.epochs) epochs in all, continuing a
        resumed run; each later call trains that many more.

        Args:
            after_epoch: called on every rank after each finished epoch with that epoch's record
                (metrics, the same on every rank); returning True stops training there. Its answer
                must be the same on every rank (e.g. rank 0's verdict, broadcast).
        Returns:
            The History of the epochs trained (rank 0's metrics, the same on every rank).
        """
        p = self.progress
        self.after_epoch = after_epoch
        first_call = not self.history
        end_epoch = (epochs or self.config.epochs) + (0 if first_call else p.epoch)
        if not first_call:
            p.fit_step = 0      # a new LR schedule; the first call continues a resumed one
        self.samples_this_fit = 0
        start = time.perf_counter()
        # Horovod: a host cut off or a frozen rank ends the job with one line naming it, never a hang;
        # an elastic job's driver drops such a worker instead and goes on (launcher/worker_watch.py).
        with peer_watch.watching(0 if self.elastic else self.config.peer_timeout_s), \
                driver_heartbeat.beating(self.config.peer_timeout_s if self.elastic else 0):
            if self.elastic:
                self.progress = self.elastic.run(p, end_epoch)
            else:
                self._check_work_left(p, end_epoch)
                self.train_until(p, end_epoch)
            self._finish(time.perf_counter() - start)
        return self.history

    def train_until(self, p: Progress, end_epoch: int) -> None:
        """The loop, from wherever `p` says training stands, to end_epoch (or max_steps, or a stop)."""
        config = self.config
        # Planned here, not once: after an elastic reset the same epochs take a different number of steps.
        done_this_epoch = -(-p.position // (config.batch_size * config.accumulate * self.world.size))
        todo = (end_epoch - p.epoch) * self.steps_per_epoch - done_this_epoch
        if config.max_steps:
            todo = min(todo, config.max_steps - p.step)
        total_steps = p.fit_step + todo
        console.open_bar(config.progress_bar, total_steps, p.fit_step)
        self.model.train()
        try:
            while (p.epoch < end_epoch and not (config.max_steps and p.step >= config.max_steps)
                   and not patience_exhausted(p.epoch, p.best_epoch, config.patience)):
                epoch_start = time.perf_counter()
                steps, seen, lr_factor = self._run_epoch(p, total_steps)
                finished = p.position >= self.epoch_samples
                self._end_epoch(p, lr_factor, time.perf_counter() - epoch_start, steps, seen)
                if finished and config.monitor:
                    self._judge(p)
                if finished and self.after_epoch is not None and self.after_epoch(self.history[-1]):
                    end_epoch = p.epoch + 1                 # asked to stop: this epoch is the last
                if finished:
                    p.epoch, p.position, p.stats, p.resplits = p.epoch + 1, 0, self.metrics.zeros(), []
                if finished and config.checkpoint_epochs and p.epoch % config.checkpoint_epochs == 0:
                    self._checkpoint(p)
                if self.elastic:
                    self.elastic.commit(p)
            if config.max_steps and p.step >= config.max_steps and p.position and not (
                    config.checkpoint_steps and p.step % config.checkpoint_steps == 0):
                self._checkpoint(p)     # stopped mid-epoch: --resume (with a higher --max-steps) goes on from here
        finally:
            console.close_bar()

    def _run_epoch(self, p: Progress, total_steps: int) -> tuple[int, int, float]:
        """Train the rest of epoch p.epoch (or up to max_steps). Returns (steps, samples seen here, LR factor)."""
        config = self.config
        warmup_steps = round(config.warmup_epochs * self.steps_per_epoch)
        # Horovod: every rank shuffles alike (seed + epoch) and resumes at the same global position.
        self._start_epoch(p)
        shard_len = self.source.shard_len()
        batches = -(-shard_len // config.batch_size)
        steps = seen = 0
        lr_factor = 1.0
        step_parts: list[BatchParts] = []    # this step's micro-batches
        applied: list[BatchParts] = []       # applied steps' batches, added to p.stats before anything reads it
        for micro, batch in enumerate(self.loader):
            if micro % config.accumulate == 0:              # a step's first micro-batch
                lr_factor = lr_at(p.fit_step, 1.0, self.lr_scale, warmup_steps, total_steps, config.lr_decay)
                for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
                    group["lr"] = base_lr * lr_factor
                self.optimizer.zero_grad()  # torch 2.x sets grads to None (Horovod's wrapper takes no args)
                step_parts = []
            batch = to_device(batch, self.device)
            with autocast(config.precision, self.device):
                try:
                    out = run_step(self.model, batch, self.loss_fn, self.step_fn)
                except Exception:
                    if self.step_fn is None:
                        labels_in_range(self.model, batch)  # a bad label past the probe batch: one line
                    raise
            # Each micro-batch weighs its share of the step's samples: K batches of b make one of K*b.
            weight = out.n / step_samples(micro, config.batch_size, config.accumulate, shard_len)
            share = out.loss if weight == 1.0 else out.loss * weight
            step_parts.append(self.metrics.batch_parts(out.loss, out.n, out.extras, out.outputs, out.targets))
            # Horovod: a step's last backward starts the allreduces; earlier ones add up gradients locally.
            (self.scaler.scale(share) if self.scaler else share).backward()
            p.position += out.n * self.world.size
            seen += out.n
            if (micro + 1) % config.accumulate and micro + 1 != batches:
                continue                                    # more micro-batches before this step
            if self._step(p, step_parts):
                applied += step_parts
            p.step, p.fit_step, steps = p.step + 1, p.fit_step + 1, steps + 1
            console.advance()
            if p.step % config.log_interval == 0 or p.step % config.commit_steps == 0 or (
                    config.checkpoint_steps and p.step % config.checkpoint_steps == 0):
                p.stats, applied = self.metrics.add_parts(p.stats, applied), []
            if p.step % config.log_interval == 0:
                self._log_interval(p, lr_factor)
            if config.checkpoint_steps and p.step % config.checkpoint_steps == 0:
                self._checkpoint(p)
            if self.elastic and p.step % config.commit_steps == 0:
                self.elastic.commit(p)                      # Horovod: may raise to admit new hosts
            if config.max_steps and p.step >= config.max_steps:
                break
        p.stats = self.metrics.add_parts(p.stats, applied)
        return steps, seen, lr_factor

    def _start_epoch(self, p: Progress) -> None:
        self.loader_rng_at_epoch = self.loader.generator.get_state()   # before iter() draws the epoch's seed
        self.source.set_epoch(p.epoch, start=p.position, resplits=p.resplits)

    def _step(self, p: Progress, parts: list[BatchParts]) -> bool:
        """Apply the step's gradients, the same on every rank; False when skipped as non-finite."""
        if self.steps_in_backward:
            self.optimizer.step()                           # Horovod: combines the Adasum deltas from backward
            return True
        loss_flag = None
        if self.check_loss:
            # Horovod: non-finite loss on any rank -> skip on all; rides in the gradients' last allreduce.
            loss = parts[0][0] if len(parts) == 1 else torch.stack([part[0] for part in parts]).double().sum()
            loss_flag = collectives.nonfinite_flag_async(loss, "step_loss", self.config.gradient_predivide_factor)
        gradients.synchronize_gradients(self.optimizer)          # Horovod: averaged gradients, equal on all ranks
        if self.scaler:
            self.scaler.unscale_(self.optimizer)            # Horovod: after the allreduce, so all ranks agree
            applied = gradients_finite(self.model, self.scaler, p, self.config.nonfinite_limit)
        else:
            applied = loss_flag is None or count_nonfinite(p, collectives.all_finite(loss_flag), "loss",
                                                           self.config.nonfinite_limit)
        if applied:
            with self.optimizer.skip_synchronize():
                if self.scaler:
                    self.scaler.step(self.optimizer)
                else:
                    self.optimizer.step()
        if self.scaler:
            self.scaler.update()                            # halve the loss scale after an overflow
        return applied

    def _reduce(self, p: Progress, name: str, seen: int = 0) -> tuple[torch.Tensor, int, int]:
        """Horovod: ONE allreduce of this rank's sums, its stop request and its samples seen.
        Returns (summed metric sums, the signal all ranks agree on, samples seen by all)."""
        size = self.metrics.size
        extra = torch.tensor([*stop_flags(STOP.signum), float(seen)], dtype=torch.float64)
        total = collectives.allreduce_sum(torch.cat([p.stats, extra]), name=name)
        flags = len(STOP_SIGNALS)
        return total[:size], agreed_signal(total[size:size + flags].tolist()), int(total[size + flags].item())

    def _log_interval(self, p: Progress, lr_factor: float) -> None:
        total, signum, _ = self._reduce(p, "train_stats")   # one allreduce per log interval, not per step
        values = self.metrics.values(total)
        if self.run.log:
            self.run.log.metrics({"kind": "train", "epoch": p.epoch, "step": p.step,
                              "lr": self.base_lrs[0] * lr_factor, **values})
        console.advance_postfix(values["loss"])
        if signum:
            self._stop(p, signum)

    def _end_epoch(self, p: Progress, lr_factor: float, seconds: float, steps: int, seen: int) -> None:
        total, signum, seen_all = self._reduce(p, "epoch_stats", seen)
        self._gather_system()
        self.samples_this_fit += seen_all
        # Horovod: one set of BatchNorm statistics for evaluation and the saved model (SyncBatchNorm keeps
        # them equal already).
        collectives.average_buffers(self.float_buffers)
        record = {"kind": "epoch", "epoch": p.epoch, "step": p.step, "lr": self.base_lrs[0] * lr_factor,
                  **self.metrics.values(total, prefix="train_"), "train_samples": int(total[1].item()),
                  **self.evaluate(),
                  # samples trained in this process's run of the epoch: not those restored from a checkpoint
                  "samples_per_s": seen_all / seconds if seconds else 0.0, "epoch_time_s": seconds,
                  "step_time_s": seconds / steps if steps else None}
        redone = bool(self.history) and self.history[-1]["epoch"] == record["epoch"]
        if redone or self.resumed:
            record["resumed"] = True   # metrics.jsonl may hold this epoch already: readers keep the last
        if redone:
            self.history[-1] = record  # elastic: the epoch's end was redone after a failure
        else:
            self.history.append(record)
        if self.run.log:
            self.run.log.metrics(record)
        console.epoch_row(record, header=len(self.history) == 1)
        if signum:
            self._stop(p, signum)

    def _gather_system(self) -> None:
        """Horovod: every host's system samples since the last call reach rank 0, which alone holds the run
        (one small allgather an epoch; other hosts may not even reach its store)."""
        if not (self.run.verdict and self.run.verdict.system_hosts):
            return
        per_rank = collectives.allgather_object(self.run.host_samples(), name="system_samples")
        self.run.record_system([sample for samples in per_rank for sample in samples])

    def _judge(self, p: Progress) -> None:
        """Best weights and early stopping on config.monitor, after each finished epoch."""
        monitor = self.config.monitor
        value = self.history[-1].get(monitor)
        verdict = (improved(p.best, value, self.metrics.higher_is_better(monitor)), value) \
            if self.world.is_root else None
        # Horovod: rank 0's verdict for all, so every rank stops at the same epoch.
        better, value = collectives.broadcast_object(verdict, name="monitor")
        if better:
            p.best, p.best_epoch = value, p.epoch
            if self.run.log:
                self.run.log.best(self.model)

    def _stop(self, p: Progress, signum: int) -> None:
        saved = self._checkpoint(p) if self.config.checkpoint_on_stop else None
        raise Stopped(signum, p.step, saved)

    def _checkpoint(self, p: Progress) -> str | None:
        """A collective: every rank contributes its RNG state and metric sums; rank 0 writes."""
        if not self.run.path:
            return None
        # Mid-epoch, the loader's generator as the epoch began: a resume draws this epoch's seed again, as the
        # run that never stopped did, not the next epoch's.
        loader_rng = self.loader_rng_at_epoch if p.position else self.loader.generator.get_state()
        per_rank = collectives.allgather_object((checkpoint.rng_state(loader_rng), p.stats),
                                                name="checkpoint_gather")
        return self.write_checkpoint(p, per_rank) if self.world.is_root else None

    def write_checkpoint(self, p: Progress, per_rank: list[tuple[Any, Any]], *, replace: bool = True) -> str | None:
        """Write as rank 0, with each rank's (RNG state, metric sums); one entry reads as a 1-worker run.
        replace=False (an elastic survivor): nothing where this step's checkpoint exists or is being written."""
        if not self.run.path:
            return None
        path = (checkpoint.save if replace else checkpoint.save_new)(checkpoint.checkpoint_dir(self.run.path), p.step, {
            "model": plain_state_dict(self.model), "optimizer": self.optimizer.state_dict(),
            "progress": p.values(stats=False), "world_size": len(per_rank),
            "rng": [r for r, _ in per_rank], "stats": [s for _, s in per_rank], "config": self.config.to_dict(),
            "data": self.data_fingerprint,
            **({"scaler": self.scaler.state_dict()} if self.scaler else {})}, self.config.keep_checkpoints)
        return str(path) if path else None

    @functools.cached_property
    def data_fingerprint(self) -> dict[str, Any]:
        """The data this run trains on, for its checkpoints and a resume's check; once, where one is read or written
        (a stat of every image file: not on every rank)."""
        return fingerprint(self.train_data, self.val_data)

    def _check_work_left(self, p: Progress, end_epoch: int) -> None:
        config = self.config
        if (not p.position and p.epoch >= end_epoch) or (config.max_steps and p.step >= config.max_steps):
            raise UserError(f"nothing to do: the run already finished {p.epoch} of {end_epoch} epochs "
                            f"({p.step} steps); raise --epochs (or --max-steps) to train longer")

    def start_run(self, found: dict[str, Any] | None, p: Progress, end_epoch: int | None = None) -> None:
        """On every rank, once the run directory's verdict is adopted: what rank 0 read to resume (already
        shared), then rank 0's banner. `end_epoch` given (elastic, inside fit): a resumed run must have work left."""
        resumed = apply_resume(found, p, self.world, self.scaler, self.loader.generator) if found is not None else None
        if found and found.get("payload"):  # before the resume line claims anything
            p.resplits = self.source.resplit(p.resplits, p.position, found["payload"]["world_size"])
        self.resumed = self.resumed or bool(found and found.get("payload"))
        if found is not None and end_epoch is not None:
            self._check_work_left(p, end_epoch)
        self._open_log(resumed, found.get("branch_from") if found else None)

    def zero_stats(self) -> torch.Tensor:
        return self.metrics.zeros()

    def _open_log(self, resumed: str | None, branch_from: int | None = None) -> None:
        """Rank 0: the run directory (if any) and the banner; once per process (elastic restarts call again).
        `branch_from`: the step a resume that may log other values than the run's first process starts at."""
        if not self.world.is_root or self.announced:
            return
        self.announced = True
        self.run.open_log(backend=runtime.backend_name(), device=self.device.type, branch_from=branch_from)
        console.banner(banner_lines(self.config, world=self.world, backend=runtime.backend_name(),
                                    device=self.device.type, train=len(self.train_data),
                                    held_out=len(self.val_data) if self.val_data is not None else 0,
                                    lr_scale=self.lr_scale, run_path=self.run.path))
        if resumed:
            console.line(f"hvdtrain: {resumed}")

    def resize(self, world: runtime.World) -> None:
        """What follows from the number of workers: set at the start and after every elastic resize."""
        config = self.config
        self.world = world
        self.source.reshard(world.rank, world.size)
        # DataLoader(drop_last=True): fewer samples per epoch, a number that depends on the workers.
        self.epoch_samples = self.source.epoch_samples()
        self.steps_per_epoch = steps_per_epoch(self.epoch_samples, world.size, config.batch_size,
                                               config.accumulate)
        self.lr_scale = scaled_lr(1.0, world.size, config.lr_scaling)

    def _finish(self, wall: float) -> None:
        p = self.progress
        self._gather_system()   # the samples since the last epoch's end
        # Horovod: proof that every replica took the same steps and ended with the same weights.
        per_rank = collectives.allgather_object((p.step, param_digest(self.model)), name="final_state")
        last = self.history[-1] if self.history else {}
        summary = {**last, "kind": "summary", "epochs_run": len(self.history), "steps": p.step,
                   "skipped_steps": p.skipped, "workers": self.world.size,
                   "samples_per_s": self.samples_this_fit / wall,
                   "wall_time_s": wall, "rank_steps": [s for s, _ in per_rank],
                   "param_digests": [d for _, d in per_rank], "run_dir": self.run.path}
        if self.config.monitor:
            summary.update(monitor=self.config.monitor, best=p.best, best_epoch=p.best_epoch,
                           stopped_early=patience_exhausted(p.epoch, p.best_epoch, self.config.patience))
        self.history.summary = summary
        if self.run.log:
            self.run.log.finish(self.history, self.model)
        console.done(summary)

    def close(self) -> None:
        """Give the run folder back and stop what the run started (samplers); its files stay. Twice is harmless."""
        self.run.close()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def evaluate(self, data: Any = None) -> dict[str, Any]:
        """Loss and metrics over `data` (default: the held-out set) as val_*, each sample counted once."""
        data = self.val_data if data is None else data
        if data is None:
            return {}
        data, loading = unwrap(data, "evaluation")
        collate = loading.collate_fn if loading and loading.collate_fn else self.val_collate
        return evaluate(self.model, data, self.loss_fn, self.step_fn, self.metrics, self.world,
                        loading.batch_size if loading else self.eval_batch_size, self.device, collate)

    def predict(self, data: Any) -> torch.Tensor:
        """Model outputs for every sample of `data`, in order, on every rank (computed sharded)."""
        data, loading = unwrap(data, "prediction")
        collate = loading.collate_fn if loading and loading.collate_fn else self.val_collate
        return predict(self.model, data, self.world, loading.batch_size if loading else self.eval_batch_size,
                       self.device, collate)


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
    # Horovod: started before the data loads. A run refused its folder stops before loading anything, and
    # an elastic worker joining a running job is in the new world at once: the others wait for its data in
    # the first sync, not in a rendezvous that gives up after --gloo-timeout-seconds.
    world = runtime.init(settings.horovod_env(config))
    with RunDirectory(RunDirSettings.of(config)) as run:   # a run that fails before writing leaves no folder
        if not config.elastic:  # (elastic: a joining worker makes no collective call before the first sync)
            verdict = run.decide() if world.is_root else None
            refused = collectives.broadcast_object(verdict and verdict.error, name="run_dir_claim")
            if refused:
                raise UserError(refused)
        data = build_data(config)
        model = build_model(config, input_shape(data.train), data.num_classes)
        with Trainer(model, data.train, data.val, config=config, run_directory=run) as trainer:
            return trainer.fit()

