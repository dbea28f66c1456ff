"""The one training config: a typed, validated dataclass, read from YAML plus `--key value` overrides."""
from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from dataclasses import dataclass
from typing import Any

import yaml

from hvdtrain.config.fields import option
from hvdtrain.config.yaml_file import load_yaml_file
from hvdtrain.errors import ConfigError

LR_SCALINGS = ("none", "linear", "sqrt")
OPTIMIZERS = ("sgd", "adam", "adamw")
DEVICES = ("auto", "cpu", "cuda")
MP_CONTEXTS = ("forkserver", "spawn", "fork")
PRECISIONS = ("fp32", "bf16", "fp16")
COMPRESSIONS = ("none", "fp16", "bf16")
OPS = ("average", "adasum")
PROGRESS_BARS = ("auto", "on", "off")
LOSSES = ("auto", "cross_entropy", "mse")
DECAYS = ("none", "cosine", "step")
TRACKERS = ("auto", "none", "mlflow", "wandb")
CHANGED_DATA = ("refuse", "accept")


@dataclass(frozen=True)
class TrainConfig:
    model: str = option("cnn", "mlp, cnn, resnet18, torchvision:NAME, timm:NAME or a plug-in 'module.path:function'")
    dataset: str = option("digits", "digits, synthetic, images:DIR, csv:FILE, parquet:PATH, shards:GLOB or a plug-in")
    image_size: int = option(64, "images:DIR: images are resized to this many pixels square")
    features: str = option("", "csv/parquet/shards: comma-separated feature columns; '' = all but the label")
    label: str = option("label", "csv/parquet/shards: the label column (integers/strings: classes; floats: regression)")
    loss: str = option("auto", "auto (cross-entropy for class labels, MSE for real-valued targets), cross_entropy, mse")
    epochs: int = option(10, "passes over the training shard")
    max_steps: int = option(0, "stop after this many optimizer steps in total; 0 = no limit")
    batch_size: int = option(32, "per worker, not global")
    eval_batch_size: int = option(256, "per worker, for evaluation")
    optimizer: str = option("sgd", "sgd, adam or adamw")
    lr: float = option(0.05, "base LR for one worker, before scaling by the number of workers")
    lr_scaling: str = option("linear", "none, linear or sqrt of the number of workers (Goyal et al.)")
    warmup_epochs: float = option(1.0, "ramp from the base LR to the scaled LR over this many epochs")
    lr_decay: str = option("cosine", "after warmup: none, cosine (to 0 at the end) or step (x0.1 at 1/2, 3/4)")
    momentum: float = option(0.9, "SGD momentum; ignored by adam/adamw")
    weight_decay: float = option(0.0, "L2 penalty (decoupled for adamw)")
    precision: str = option("fp32", "fp32, bf16 (autocast, CPU or CUDA) or fp16 (CUDA only, with a loss scaler)")
    accumulate: int = option(1, "micro-batches per optimizer step; one allreduce per step, not per micro-batch")
    compression: str = option("none", "gradients on the wire: none, fp16 or bf16 (half the bytes; bf16: fp32's range)")
    op: str = option("average", "gradient reduction: average, or adasum (MPI; use with --lr-scaling none)")
    gradient_predivide_factor: float = option(1.0, "average: divide by this before the sum, by workers/this after")
    max_grad_norm: float = option(0.0, "clip the averaged gradients to this global L2 norm; 0 = off")
    bucket_mb: float = option(25.0, "allreduce gradients in buckets of this many MB, as DDP; 0 = each on its own")
    sync_bn: bool = option(False, "convert BatchNorm layers to Horovod's SyncBatchNorm (global batch statistics)")
    compile: bool = option(False, "torch.compile the model once it is on its device (the first steps compile: "
                                  "slow; CPU needs a C++ compiler); saved weights are the plain model's")
    monitor: str = option("", "a held-out metric (val_acc, val_loss, val_mse...) for best.pt and patience; '' = off")
    metrics: str = option("auto", "comma-separated: acc, topK_acc (e.g. top5_acc), mse, mae; auto = by task")
    patience: int = option(0, "stop after this many epochs without a better `monitor`; 0 = never stop early")
    hidden: int = option(128, "width of the built-in MLP's hidden layers")
    val_fraction: float = option(0.2, "held-out share of a built-in dataset, split with `seed`")
    synthetic_samples: int = option(2048, "size of the synthetic dataset")
    synthetic_shape: tuple[int, ...] = option((1, 28, 28), "per-sample input shape of the synthetic dataset")
    num_classes: int = option(10, "classes of the synthetic dataset")
    seed: int = option(42, "model init, split, and shuffle order; the same on every rank")
    log_interval: int = option(20, "steps between metric allreduces and progress lines")
    progress_bar: str = option("auto", "auto (a terminal or notebook of your own, never under a launcher), on or off")
    tensorboard: bool = option(True, "also write TensorBoard events to <run>/tensorboard, if tensorboard is installed")
    tracking: str = option("auto", "none, mlflow (store: $MLFLOW_TRACKING_URI, else <run-dir>/mlflow.db) or wandb; "
                                   "auto = mlflow when MLFLOW_TRACKING_URI is set, else none")
    tracking_experiment: str = option("hvdtrain", "the MLflow experiment (W&B project) runs are logged under")
    timeline_file: str = option("", "write Horovod's timeline (Chrome trace JSON) to this file; '' = off")
    autotune: bool = option(False, "let Horovod tune its fusion buffer and cycle time while training")
    stall_check_s: int = option(60, "Horovod warns when ranks wait this long for each other; 0 = no check")
    stall_shutdown_s: int = option(0, "Horovod aborts the job after a stall this long; 0 = never")
    peer_timeout_s: int = option(45, "a rank silent this long (host unreachable, process frozen) ends the job with "
                                     "one line naming its host (elastic: the job drops it and goes on); shorter "
                                     "blips are ridden out; 0 = off")
    gloo_timeout_s: int = option(60, "Gloo fails a collective that waits this long (at 60, horovodrun's "
                                     "--gloo-timeout-seconds wins); keep it above --peer-timeout-s")
    threads: int = option(0, "torch threads per worker; 0 = cores / workers on this host")
    device: str = option("auto", "auto (CUDA pinned to local_rank when present), cpu or cuda")
    keep_host_memory: bool = option(True, "keep freed host memory for the next step instead of returning it to the "
                                          "OS and page-faulting it back (glibc malloc thresholds)")
    run_dir: str = option("runs", "parent folder of run directories; empty = write nothing")
    name: str = option("", "run directory name; empty = model-dataset-timestamp")
    checkpoint_epochs: int = option(1, "write a checkpoint every N epochs; 0 = not at epoch ends")
    checkpoint_steps: int = option(0, "also write one every N optimizer steps (mid-epoch); 0 = off")
    keep_checkpoints: int = option(3, "newest checkpoints kept in <run>/checkpoints")
    resume: str = option("", "'auto' (newest valid checkpoint of run --name, if any) or a path")
    resume_changed_data: str = option("refuse", "--resume over data whose files or content changed since the "
                                                "checkpoint: refuse, or accept (the shuffle and held-out split differ)")
    checkpoint_on_stop: bool = option(True, "on SIGINT/SIGTERM, write a checkpoint before exiting")
    nonfinite_limit: int = option(5, "skip steps whose loss is not finite on some rank; abort after N in a row")
    elastic: bool = option(False, "elastic training under horovodrun --min-np/--max-np (Gloo)")
    commit_steps: int = option(10, "elastic: steps between state commits (work redone after a failure)")
    stages: int = option(1, "model parallel: split an nn.Sequential model into K stages, one device each")
    stage_split: tuple[int, ...] = option((), "layers per stage, e.g. 3,5; empty = balanced by parameter count")
    micro_batches: int = option(1, "model parallel: pieces per batch so stages overlap (GPipe fill/drain)")
    collate_fn: str = option("", "plug-in 'module:function' making a batch of a list of samples (e.g. padding)")
    workers: int = option(0, "data loader worker processes per rank; 0 = load in the training process")
    prefetch_factor: int = option(2, "batches each loader worker prepares ahead (workers > 0)")
    persistent_workers: bool = option(True, "keep loader workers alive across epochs (workers > 0)")
    mp_context: str = option("forkserver", "loader workers' start method: forkserver (fork-safe), spawn or fork")

    def __post_init__(self) -> None:
        for key in ("epochs", "batch_size", "eval_batch_size", "hidden", "synthetic_samples", "image_size",
                    "num_classes", "log_interval", "accumulate", "keep_checkpoints", "commit_steps", "stages",
                    "micro_batches", "prefetch_factor", "gloo_timeout_s", "lr"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key} must be > 0, got {getattr(self, key)}")
        for key in ("max_steps", "threads", "warmup_epochs", "weight_decay", "momentum", "checkpoint_epochs",
                    "checkpoint_steps", "nonfinite_limit", "max_grad_norm", "workers", "patience", "stall_check_s",
                    "stall_shutdown_s", "peer_timeout_s"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{key} must be >= 0, got {getattr(self, key)}")
        if not 0 < self.val_fraction < 1:
            raise ConfigError(f"val_fraction must be between 0 and 1 (exclusive), got {self.val_fraction}")
        if not self.synthetic_shape or any(d <= 0 for d in self.synthetic_shape):
            raise ConfigError(f"synthetic_shape must be positive sizes like 1,28,28, got {self.synthetic_shape}")
        _check_choice("lr_scaling", self.lr_scaling, LR_SCALINGS)
        _check_choice("optimizer", self.optimizer, OPTIMIZERS)
        _check_choice("lr_decay", self.lr_decay, DECAYS)
        _check_choice("device", self.device, DEVICES)
        _check_choice("mp_context", self.mp_context, MP_CONTEXTS)
        if self.micro_batches > 1 and self.stages == 1:
            raise ConfigError(f"micro_batches {self.micro_batches} needs a model split into stages: pass --stages 2 "
                              "or more")
        if self.compile and self.stages > 1:
            raise ConfigError(f"compile is not supported with stages {self.stages} yet (a pipeline over several "
                              "devices has not been tried compiled); drop --compile or use --stages 1")
        if self.stage_split and (len(self.stage_split) != self.stages or min(self.stage_split) < 1):
            raise ConfigError(f"stage_split must give a positive layer count for each of the {self.stages} "
                              f"stages, got {self.stage_split}")
        self._check_features()
        if self.resume == "auto" and not (self.name and self.run_dir):
            raise ConfigError("resume auto needs the run to resume: pass --name NAME (and a --run-dir)")
        if "/" in self.name or self.name in (".", ".."):
            raise ConfigError(f"name must be a plain folder name, got {self.name!r}")

    def _check_features(self) -> None:
        _check_choice("precision", self.precision, PRECISIONS)
        _check_choice("compression", self.compression, COMPRESSIONS)
        _check_choice("op", self.op, OPS)
        _check_choice("progress_bar", self.progress_bar, PROGRESS_BARS)
        _check_choice("loss", self.loss, LOSSES)
        _check_choice("tracking", self.tracking, TRACKERS)
        _check_choice("resume_changed_data", self.resume_changed_data, CHANGED_DATA)
        if self.monitor and not self.monitor.startswith("val_"):
            raise ConfigError(f"monitor must name a held-out metric such as val_acc or val_loss, got {self.monitor!r}")
        if self.precision == "fp16" and self.device == "cpu":
            raise ConfigError("precision fp16 needs a CUDA device (float16 autocast with a loss scaler); "
                              "on CPU use --precision bf16")
        if self.precision == "fp16" and self.elastic:
            raise ConfigError("precision fp16 is not supported with elastic yet (the loss scale is not part of the "
                              "elastic state, so a joining worker would scale differently); use bf16")
        if self.bucket_mb < 0:
            raise ConfigError(f"bucket_mb must be >= 0 (0: no buckets), got {self.bucket_mb}")
        if self.gradient_predivide_factor <= 0:
            raise ConfigError(f"gradient_predivide_factor must be > 0, got {self.gradient_predivide_factor}")
        if self.op == "adasum":
            if self.lr_scaling != "none":
                raise ConfigError("op adasum combines gradients adaptively and wants the one-worker LR: "
                                  "add --lr-scaling none")
            if self.gradient_predivide_factor != 1.0:
                raise ConfigError("gradient_predivide_factor applies only to op average, not adasum")
            if self.max_grad_norm:
                raise ConfigError("max_grad_norm cannot be combined with op adasum (it steps inside backward, on "
                                  "each rank's own gradients); drop --max-grad-norm or use --op average")
            if self.precision == "fp16":
                raise ConfigError("precision fp16 cannot be combined with op adasum (Adasum applies each tensor's "
                                  "update inside backward, before a loss scaler could check it); use bf16")
        if self.patience and not self.monitor:
            raise ConfigError("patience needs a metric to watch: add --monitor val_acc or --monitor val_loss")

    def changed(self) -> dict[str, Any]:
        """The keys whose values differ from the defaults (what the console banner shows)."""
        defaults = TrainConfig().to_dict()
        return {key: value for key, value in self.to_dict().items() if defaults[key] != value}

    def to_dict(self) -> dict[str, Any]:
        tuples = {"synthetic_shape": list(self.synthetic_shape), "stage_split": list(self.stage_split)}
        return {**dataclasses.asdict(self), **tuples}   # YAML lists, in the fields' order


def _check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{key} must be one of {', '.join(choices)}; got {value!r}")


FIELD_TYPES: dict[str, Any] = typing.get_type_hints(TrainConfig)


def _unknown_key(key: str, also: tuple[str, ...] = (), what: str = "config key") -> ConfigError:
    close = difflib.get_close_matches(key, [*FIELD_TYPES, *also], n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else f" (known keys: {', '.join(FIELD_TYPES)})"
    return ConfigError(f"unknown {what} {key!r}{hint}")


def with_values(config: TrainConfig, values: dict[str, Any], *, also: tuple[str, ...] = (),
                what: str = "config key") -> TrainConfig:
    """`config` with keyword values over it (e.g. the Trainer's `epochs=5`), validated as the config's own; an
    unknown key is a one-line ConfigError naming the closest one (among the keys and `also`, the caller's own
    arguments, called `what`)."""
    for key in values:
        if key not in FIELD_TYPES:
            raise _unknown_key(key, also, what)
    return dataclasses.replace(config, **{key: coerce(key, value) for key, value in values.items()})


def coerce(key: str, value: Any) -> Any:
    """Turn a YAML value or a command-line string into the field's type, or explain why not."""
    kind = FIELD_TYPES[key]
    from_cli = isinstance(value, str)
    try:
        if kind is bool:
            if from_cli and value.lower() in ("true", "yes", "1", "false", "no", "0"):
                return value.lower() in ("true", "yes", "1")
            if isinstance(value, bool):
                return value
        elif kind is int:
            if from_cli:
                return int(value)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        elif kind is float:
            if from_cli or (isinstance(value, (int, float)) and not isinstance(value, bool)):
                number = float(value)
                if math.isfinite(number):  # nan and inf are no learning rate, momentum or epoch count
                    return number
        elif kind is str:
            if from_cli or isinstance(value, str):
                return value
            if value is None:
                return ""
        else:  # tuple[int, ...]
            items = [item for item in value.split(",") if item.strip()] if from_cli else value
            if isinstance(items, (list, tuple)):
                return tuple(int(item) for item in items)
    except (TypeError, ValueError, OverflowError):  # OverflowError: float(10**400), int(inf)
        pass
    expected = {bool: "true/false", int: "an integer", float: "a finite number", str: "a string"}.get(
        kind, "comma-separated integers like 1,28,28")
    raise ConfigError(f"{key} must be {expected}, got {value!r}")


def parse_overrides(args: list[str]) -> dict[str, str]:
    """['--batch-size', '64', '--lr=0.1'] -> {'batch_size': '64', 'lr': '0.1'}."""
    result: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or arg == "--":
            raise ConfigError(f"expected --key value, got {arg!r}")
        key, eq, value = arg[2:].partition("=")
        key = key.replace("-", "_")
        if key not in FIELD_TYPES:
            raise _unknown_key(key)
        if not eq:
            if i + 1 >= len(args):
                raise ConfigError(f"--{key} needs a value")
            i += 1
            value = args[i]
        result[key] = value
        i += 1
    return result


def read_yaml(path: str) -> dict[str, Any]:
    data = load_yaml_file(path, "config file", "--config")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must be a mapping of key: value, got {type(data).__name__}")
    return data


def load_config(path: str | None = None, overrides: list[str] | None = None,
                **values: Any) -> TrainConfig:
    """Defaults, then the YAML file, then command-line overrides, then keyword values."""
    merged: dict[str, Any] = {}
    for key, value in (read_yaml(path) if path else {}).items():
        key = str(key).replace("-", "_")
        if key not in FIELD_TYPES:
            raise _unknown_key(key)
        merged[key] = coerce(key, value)
    for key, value in parse_overrides(overrides or []).items():
        merged[key] = coerce(key, value)
    for key, value in values.items():
        if key not in FIELD_TYPES:
            raise _unknown_key(key)
        merged[key] = coerce(key, value)
    return TrainConfig(**merged)


def to_yaml(config: TrainConfig) -> str:
    return yaml.safe_dump(config.to_dict(), sort_keys=False)
