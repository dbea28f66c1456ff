"""The training loop: read it top to bottom. Lines that exist only for distribution say `# Horovod:`."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch import nn

from hvdtrain.checkpoint.manager import Checkpointer, CheckpointSettings
from hvdtrain.checkpoint.rng_state import RandomState
from hvdtrain.checkpoint.stateful import TrainingState
from hvdtrain.config.train_config import TrainConfig, with_values
from hvdtrain.data.loader import LoadingSettings, build_loader
from hvdtrain.data.shard_source import ShardSource
from hvdtrain.data.sharding import ShardSampler, check_fits, step_samples, steps_per_epoch
from hvdtrain.data.streaming import stream_source
from hvdtrain.data.user_loader import prepare
from hvdtrain.distributed import collectives, gradients, runtime, sync_bn
from hvdtrain.errors import Stopped, UserError
from hvdtrain.models.builtin import recipe_for
from hvdtrain.models.compiled import compile_model, is_compiled
from hvdtrain.models.pipeline import place
from hvdtrain.output.console import banner_lines, console
from hvdtrain.output.history import History
from hvdtrain.output.run_directory import RunDirectory, RunDirSettings
from hvdtrain.train.batch import to_device
from hvdtrain.train.callbacks import Callbacks
from hvdtrain.train.device import pick_device
from hvdtrain.train.early_stopping import Monitor
from hvdtrain.train.evaluation import Collate, evaluate, held_out, predict, probe_batch
from hvdtrain.train.learning_rate import LearningRate, SchedulerArg
from hvdtrain.train.loop_run import ElasticRun, ElasticSettings, LocalRun, LoopHooks
from hvdtrain.train.lr_schedule import scaled_lr, schedule_steps
from hvdtrain.train.metrics import BatchParts, Metric
from hvdtrain.train.optim import make_optimizer
from hvdtrain.train.optimizer_step import OptimizerStep, step_loss
from hvdtrain.train.precision import Precision, PrecisionSettings
from hvdtrain.train.progress import MetricSums, Progress
from hvdtrain.train.reporting import MetricsSettings, Reporter, first_batch_layout
from hvdtrain.train.run_start import prepare_run, start_horovod
from hvdtrain.train.step import LossFn, StepFn, check_step, default_loss, labels_in_range, run_step

AfterEpoch = Callable[[dict[str, Any]], bool]
OWN_KEYWORDS = ("optimizer", "loss_fn", "step_fn", "metrics", "config", "collate_fn", "run_directory",
                "handle_signals", "callbacks", "lr_scheduler", "lr_scheduler_interval")


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
        **settings: config keys as keywords (`epochs=5, lr=1e-3, batch_size=64`), over `config`.
        callbacks: objects answering the loop's events (train/callbacks.py): on_fit_start, on_step_end,
            on_before_optimizer_step, on_epoch_end (True stops every rank), on_fit_end; with
            state_dict/load_state_dict, their state travels in checkpoints.
        lr_scheduler: a torch LR scheduler over `optimizer` (or a function taking the optimizer, returning one),
            stepped after every optimizer step (lr_scheduler_interval="epoch": after every epoch), saved in
            checkpoints; it sets the one-worker LRs, each step runs them scaled for the workers.
        collate_fn: turns a list of samples into a batch (e.g. padding), for a Dataset; default torch's
            (or `config.collate_fn`, or the DataLoader's own).
        run_directory: the run folder already decided on rank 0 (hvdtrain.fit claims it before the data
            loads); default: decided here. `close()` (or `with Trainer(...)`) gives it back.
        handle_signals: SIGTERM, SIGUSR1, Ctrl-C stop fit() with a checkpoint, as in the CLI; False in a notebook.
    Example:
        >>> with hvdtrain.Trainer(my_model, train_ds, val_ds, epochs=5, lr=0.05) as trainer:
        ...     history = trainer.fit()
        ...     trainer.evaluate()["val_acc"], trainer.predict(val_ds).shape
    """

    def __init__(self, model: nn.Module, train_data: Any, val_data: Any = None, *,
                 optimizer: torch.optim.Optimizer | None = None, loss_fn: LossFn | None = None,
                 step_fn: StepFn | None = None, metrics: Sequence[str | Metric] | None = None,
                 config: TrainConfig | None = None, collate_fn: Collate | None = None,
                 run_directory: RunDirectory | None = None, handle_signals: bool = True,
                 callbacks: Sequence[Any] = (), lr_scheduler: SchedulerArg | None = None,
                 lr_scheduler_interval: str = "step", **settings: Any) -> None:
        # Keywords over the config; a string for optimizer, metrics or collate_fn names the config's (adam, "acc").
        named = {k: v for k, v in dict(optimizer=optimizer, metrics=metrics, collate_fn=collate_fn).items()
                 if isinstance(v, str)}
        optimizer = None if isinstance(optimizer, str) else optimizer
        metrics = None if isinstance(metrics, str) else metrics
        collate_fn = None if isinstance(collate_fn, str) else collate_fn
        self.setup = prepare_run(with_values(config or TrainConfig(), {**settings, **named}, also=OWN_KEYWORDS,
                                             what="Trainer keyword"), handle_signals=handle_signals)  # as the CLI's
        config = self.setup.config
        data = prepare(train_data, val_data, collate_fn, config.collate_fn, config.batch_size)
        train_data, val_data, loading = data.train, data.val, data.settings
        if loading is not None and loading.batch_size != config.batch_size:
            config = dataclasses.replace(config, batch_size=loading.batch_size)  # the user's DataLoader's
        self.config = config
        self.val_collate, self.eval_batch_size = data.val_collate, data.val_batch_size or config.eval_batch_size
        world = self.world = start_horovod(config)  # Horovod (timeline, autotune, stall check), threads, host memory
        # Horovod: with K stages this worker owns GPUs local_rank*K ... local_rank*K+K-1; inputs go to the first.
        self.device = pick_device(config.device, world.local_rank, local_size=world.local_size, stages=config.stages)
        self.precision = Precision(PrecisionSettings.of(config), self.device)
        stream = stream_source(train_data, elastic=config.elastic)
        check_fits(len(train_data), world.size)
        if config.monitor and val_data is None:
            raise UserError(f"monitor {config.monitor} needs held-out data (val_data); drop --monitor")
        self.train_data, self.val_data = train_data, val_data
        # Horovod: with sync_bn, BatchNorm statistics come from the global batch, not each worker's shard.
        model = sync_bn.convert_sync_bn(model) if config.sync_bn else model
        self.model = place(model, self.device, stages=config.stages, split=config.stage_split,
                           micro_batches=config.micro_batches)
        if config.compile or is_compiled(self.model):  # after placement: compiled for the device it runs on
            self.model = compile_model(self.model, note=world.is_root)
        self.step_fn = step_fn
        first = probe_batch(train_data, max(2, config.micro_batches), loading.collate_fn if loading else None)
        self.loss_fn: LossFn = loss_fn or default_loss(config.loss, first)
        self.float_buffers = [] if config.sync_bn else [b for b in self.model.buffers() if b.is_floating_point()]
        self.run = run_directory or RunDirectory(RunDirSettings.of(config))
        self.run.record(config, recipe_for(model, config))   # config.yaml; model.json for a model not built from it
        sections = MetricsSettings.of(config)   # the metrics' layout follows from one step on the first batch
        self.reporter = Reporter(sections, first_batch_layout(
            sections, metrics, self.model, first, self.device, lambda m, b: check_step(m, b, self.loss_fn, step_fn),
            self.precision.autocast(), default_step=step_fn is None), self.run)
        self.progress = Progress(stats=self.reporter.zeros())
        # Horovod's wrapper is a new optimizer object: state is loaded into it, not into the original.
        self.optimizer: Any = gradients.wrap_optimizer(
            optimizer or make_optimizer(config, self.model), self.model, accumulate=config.accumulate,
            compression=config.compression, op=config.op,
            gradient_predivide_factor=config.gradient_predivide_factor, bucket_mb=config.bucket_mb)
        self.lr = LearningRate(self.optimizer, optimizer, decay=config.lr_decay, warmup_epochs=config.warmup_epochs,
                               scheduler=lr_scheduler, interval=lr_scheduler_interval)
        monitor = config.monitor and Monitor(config.monitor, config.patience,
                                             self.reporter.metrics.higher_is_better(config.monitor))
        self.callbacks = Callbacks([*([monitor] if monitor else []), *callbacks])   # best.pt first: users see it
        before_step = self.callbacks.wants("on_before_optimizer_step")
        self.optimizer_step = OptimizerStep(
            self.optimizer, self.model, self.precision, op=config.op, nonfinite_limit=config.nonfinite_limit,
            norms=self.reporter.grad_norms, max_norm=config.max_grad_norm, predivide=config.gradient_predivide_factor,
            before_step=(lambda: self.callbacks.before_optimizer_step(self, self.optimizer)) if before_step else None)
        # What this rank reads: a stream shards itself; a map-style dataset is read through a ShardSampler.
        sampler = ShardSampler(len(train_data), world.rank, world.size, seed=config.seed,
                               shuffle=loading.shuffle if loading else True,
                               drop_last_batch=config.batch_size if loading and loading.drop_last else 0)
        self.source: ShardSource = stream or sampler
        self.loader = build_loader(train_data, None if stream else sampler, LoadingSettings.of(config), world.rank,
                                   self.device, loading)
        self.random = RandomState(self.loader.generator)
        self._resize(world)
        self.checkpointer = Checkpointer(CheckpointSettings.of(config), self.run, self.model, self.optimizer,
                                         (train_data, val_data), scheduled=self.lr.scheduler is not None)
        hooks = LoopHooks(train=self._train_until, begin=self._begin, resize=self._resize, state=self._state,
                          zero_stats=self.reporter.zeros,
                          check_work_left=lambda p, end_epoch: p.check_work_left(end_epoch, config.max_steps))
        runner = ElasticRun if config.elastic else LocalRun   # the one place elastic and fixed-size runs differ
        self.loop_runner: LocalRun | ElasticRun = runner(ElasticSettings.of(config), hooks, self.run,
                                                         self.checkpointer, self.model, self.optimizer)
        with self.run.closed_on_error(owned=run_directory is None):   # a caller's is the caller's to close
            self.loop_runner.open(self.progress, is_root=world.is_root)   # rank 0's run-directory verdict for all

    @property
    def history(self) -> History:
        """The epochs trained (rank 0's metrics, the same on every rank); `.summary` after fit()."""
        return self.reporter.history

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
        first_call = not self.history
        end_epoch = (epochs or self.config.epochs) + (0 if first_call else p.epoch)
        if not first_call:
            p.fit_step = 0      # a new LR schedule; the first call continues a resumed one
        self.reporter.samples_this_fit, start = 0, time.perf_counter()
        # The tuner's hook, as a callback for this call only (it has no state: the checkpoint's keys stay put).
        with self.setup.stops(), self.loop_runner.watching(), runtime.started(), self.callbacks.adding(after_epoch):
            # Horovod: a lost or frozen rank is named, never a hang. A stop signal ends the loop with a checkpoint.
            self.callbacks.fit_start(self)
            self.progress = self.loop_runner.run(p, end_epoch)
            self.reporter.finish(self.progress, time.perf_counter() - start, self.model, self.world)
            self.callbacks.fit_end(self, self.history)
        return self.history

    def _train_until(self, p: Progress, end_epoch: int) -> None:
        """The loop, from wherever `p` says training stands, to end_epoch (or max_steps, or a stop)."""
        config = self.config
        total_steps = schedule_steps(p.fit_step, p.position, end_epoch - p.epoch, self.steps_per_epoch,
                                     config.batch_size * config.accumulate * self.world.size,
                                     config.max_steps - p.step if config.max_steps else None)
        console.open_bar(config.progress_bar, total_steps, p.fit_step)
        self.model.train()
        try:
            while p.epoch < end_epoch and not (config.max_steps and p.step >= config.max_steps):
                epoch_start = time.perf_counter()
                steps, seen = self._run_epoch(p, total_steps)
                finished = p.position >= self.epoch_samples
                # Horovod: one set of BatchNorm statistics for evaluation and the saved model (SyncBatchNorm
                # keeps them equal already).
                collectives.average_buffers(self.float_buffers)
                self._stop_if(p, self.reporter.end_epoch(p, self.lr.applied, time.perf_counter() - epoch_start,
                                                         steps, seen, self.evaluate()))
                if finished:
                    self.lr.end_epoch(self.history[-1], config.monitor)
                if finished and self.callbacks.epoch_end(self, p.epoch, self.history[-1]):
                    end_epoch = p.epoch + 1                 # a callback asked to stop: this epoch is the last
                if finished:
                    p.epoch, p.position, p.stats, p.resplits = p.epoch + 1, 0, self.reporter.zeros(), []
                    self.random.mark()
                if finished and self.checkpointer.due_at_epoch(p.epoch):
                    self._checkpoint(p)
                self.loop_runner.commit(p)
            if config.max_steps and p.step >= config.max_steps and p.position and not (
                    self.checkpointer.due_at_step(p.step)):
                self._checkpoint(p)     # stopped mid-epoch: --resume (with a higher --max-steps) goes on from here
        finally:
            console.close_bar()

    def _run_epoch(self, p: Progress, total_steps: int) -> tuple[int, int]:
        """Train the rest of epoch p.epoch (or up to max_steps). Returns (steps, samples seen here)."""
        config = self.config
        self.random.mark()   # before iter() draws the epoch's seed
        # Horovod: every rank shuffles alike (seed + epoch) and resumes at the same global position.
        self.source.set_epoch(p.epoch, start=p.position, resplits=p.resplits)
        shard_len = self.source.shard_len()
        batches = -(-shard_len // config.batch_size)
        steps, seen = 0, 0
        step_parts: list[BatchParts] = []    # this step's micro-batches
        applied: list[BatchParts] = []       # applied steps' batches, added to p.stats before anything reads it
        for micro, batch in enumerate(self.loader):
            if micro % config.accumulate == 0:              # a step's first micro-batch
                self.lr.start_step(p.fit_step, total_steps)
                self.optimizer.zero_grad()  # torch 2.x sets grads to None (Horovod's wrapper takes no args)
                step_parts = []
            batch = to_device(batch, self.device)
            with self.precision.autocast():
                try:
                    out = run_step(self.model, batch, self.loss_fn, self.step_fn)
                except Exception:
                    if self.step_fn is None:
                        labels_in_range(self.model, batch)  # a bad label past the probe batch: one line
                    raise
            # Each micro-batch weighs its share of the step's samples: K batches of b make one of K*b.
            weight = out.n / step_samples(micro, config.batch_size, config.accumulate, shard_len)
            share = out.loss if weight == 1.0 else out.loss * weight
            step_parts.append(self.reporter.metrics.batch_parts(out.loss, out.n, out.extras, out.outputs, out.targets))
            self.optimizer_step.before_backward(step_parts)  # Horovod: the loss flag goes in the first bucket
            self.precision.scale(share).backward()  # Horovod: the step's last backward starts the allreduces
            p.position += out.n * self.world.size
            seen += out.n
            if (micro + 1) % config.accumulate and micro + 1 != batches:
                continue                                    # more micro-batches before this step
            if self.optimizer_step.apply(p, step_parts):
                applied += step_parts
            self.lr.end_step()
            p.step, p.fit_step, steps = p.step + 1, p.fit_step + 1, steps + 1
            console.advance()
            self.callbacks.step_end(self, p.step, partial(step_loss, step_parts), self.lr.applied,
                                    self.optimizer_step.last_norm)
            if p.step % config.log_interval == 0 or p.step % config.commit_steps == 0 or (
                    self.checkpointer.due_at_step(p.step)):
                p.stats, applied = self.reporter.metrics.add_parts(p.stats, applied), []
            if p.step % config.log_interval == 0:
                self._stop_if(p, self.reporter.log_interval(p, self.lr.applied))
            if self.checkpointer.due_at_step(p.step):
                self._checkpoint(p)
            self.loop_runner.commit(p, step=True)                # Horovod: an elastic commit may admit new hosts
            if config.max_steps and p.step >= config.max_steps:
                break
        p.stats = self.reporter.metrics.add_parts(p.stats, applied)
        return steps, seen

    def _stop_if(self, p: Progress, signum: int) -> None:   # a signal every rank agreed on (0: none)
        if signum:
            raise Stopped(signum, p.step, self._checkpoint(p) if self.config.checkpoint_on_stop else None)

    def _checkpoint(self, p: Progress) -> str | None:
        return self.checkpointer.gather_and_save(self._state(p), p.step, is_root=self.world.is_root)

    def _state(self, p: Progress, own_loader: bool = True) -> TrainingState:
        """What a checkpoint holds, by file key (checkpoint/stateful.py); no loader RNG without `own_loader`."""
        return TrainingState({"progress": p, "scaler": self.precision, "lr_scheduler": self.lr,
                              "callbacks": self.callbacks},
                             {"rng": self.random if own_loader else RandomState(), "stats": MetricSums(p)})

    def _begin(self, found: dict[str, Any] | None, p: Progress, end_epoch: int | None = None) -> None:
        """Every rank: adopt rank 0's resume reading (elastic, with `end_epoch`: work must be left), the banner."""
        resumed = self.checkpointer.adopt(found, self._state(p), p, self.world, self.source.resplit)
        self.reporter.resumed = self.reporter.resumed or bool(found and found.get("payload"))
        if found is not None and end_epoch is not None:
            p.check_work_left(end_epoch, self.config.max_steps)
        if self.world.is_root:   # once per process (elastic restarts call again)
            self.run.announce(lambda: banner_lines(
                self.config, world=self.world, backend=runtime.backend_name(), device=self.device.type,
                train=len(self.train_data), held_out=len(self.val_data) if self.val_data is not None else 0,
                lr_scale=self.lr_scale, run_path=self.run.path), resumed, backend=runtime.backend_name(),
                device=self.device.type, branch_from=found.get("branch_from") if found else None)

    def _resize(self, world: runtime.World) -> None:
        """What follows from the number of workers: set at the start and after every elastic resize."""
        config, self.world = self.config, world
        self.source.reshard(world.rank, world.size)
        # DataLoader(drop_last=True): fewer samples per epoch, a number that depends on the workers.
        self.epoch_samples = self.source.epoch_samples()
        self.steps_per_epoch = steps_per_epoch(self.epoch_samples, world.size, config.batch_size, config.accumulate)
        self.lr_scale = scaled_lr(1.0, world.size, config.lr_scaling)
        self.lr.resize(self.lr_scale, self.steps_per_epoch)

    def close(self) -> None:
        """Give the run folder back and stop what the run started (samplers); its files stay. Twice is harmless."""
        self.run.close()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *_: object) -> None:   # an error inside the with block propagates
        self.close()

    def evaluate(self, data: Any = None) -> dict[str, Any]:
        """Loss and metrics over `data` (default: the held-out set) as val_*, each sample counted once."""
        if data is None and self.val_data is None:
            return {}
        data, batch_size, collate = held_out(self.val_data if data is None else data, "evaluation",
                                             self.eval_batch_size, self.val_collate)
        return evaluate(self.model, data, self.loss_fn, self.step_fn, self.reporter.metrics, self.world,
                        batch_size, self.device, collate)

    def predict(self, data: Any) -> torch.Tensor:
        """Model outputs for every sample of `data`, in order, on every rank (computed sharded)."""
        data, batch_size, collate = held_out(data, "prediction", self.eval_batch_size, self.val_collate)
        return predict(self.model, data, self.world, batch_size, self.device, collate)
