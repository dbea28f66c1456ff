"""`CompressOptions`: every option of `hvdtrain compress`, declared once, validated on construction.

Kept free of torch imports so the CLI can build its parser (and `--help`) without loading a model stack.
"""
from __future__ import annotations

from dataclasses import dataclass

from hvdtrain.config.fields import option
from hvdtrain.errors import UserError

METHODS = ("int8", "prune", "distill")
TRAINED = ("prune", "distill")         # methods that train, on every Horovod worker
MODES = ("auto", "dynamic", "weight-only", "static")  # int8 modes; auto picks static for conv models


@dataclass(frozen=True)
class CompressOptions:
    """How to compress; every field but `verbose` is a flag of `hvdtrain compress` (generated from these)."""
    method: str = option("int8", "int8, prune or distill; several, comma-separated (e.g. int8,prune), are "
                                 "compared side by side")
    out: str = option("", "new run directory; '' = RUN_DIR-METHOD (RUN_DIR-compressed for several methods)")
    int8_mode: str = option("auto", "auto (static PT2E for models with Conv2d, else dynamic), dynamic, weight-only "
                                    "or static", choices=MODES)
    calibration: int = option(256, "training samples that calibrate static int8")
    sparsity: float = option(0.5, "prune: share of each hidden layer's channels/neurons removed")
    epochs: int = option(0, "prune: fine-tune epochs (0 = 3); distill: student epochs (0 = the source run's)")
    lr: float = option(0.0, "prune/distill: base LR for one worker; 0 = the source run's")
    student: str = option("mlp", "distill: built-in (mlp, cnn) or plug-in 'module:function' model")
    student_hidden: int = option(64, "distill: the student's `hidden` width")
    temperature: float = option(4.0, "distill: softens teacher and student outputs")
    alpha: float = option(0.5, "distill: weight of the teacher's soft targets; 1 - alpha on the labels")
    baseline: bool = option(True, "distill: also train the student without the teacher, same budget, to compare")
    threads: int = option(1, "torch threads while timing latency")
    repeats: int = option(30, "timed forward passes per model and batch size (the median is reported)")
    batch_sizes: tuple[int, ...] = option((1, 64), "latency batch sizes, comma-separated")
    compiled: bool = option(False, "also time each model after torch.compile (inductor): int8's fused kernels; "
                                   "slow to compile", flag="--compile")
    tracking: str = option("", "log the report and the exported model as an MLflow run: auto, none, mlflow; "
                               "'' = as the source run's --tracking")
    model: str = option("", "a builder 'module:function' (config, input_shape, num_classes) that returns the trained "
                            "model, for a run whose model.json says hvdtrain cannot rebuild it; '' = as the run "
                            "recorded", metavar="MODULE:FUNCTION")
    verbose: bool = option(True, "rank 0 prints progress and the table (the Python API's switch)")

    def __post_init__(self) -> None:
        for method in self.methods:
            if method not in METHODS:
                raise UserError(f"unknown method {method!r}; choose one of {', '.join(METHODS)} (or several, "
                                "comma-separated)")
        if not self.methods or len(set(self.methods)) != len(self.methods):
            raise UserError(f"method must name each of int8, prune, distill at most once, got {self.method!r}")
        if self.tracking not in ("", "auto", "none", "mlflow", "wandb"):
            raise UserError(f"tracking must be auto, none or mlflow; got {self.tracking!r}")
        if self.int8_mode not in MODES:
            raise UserError(f"int8 mode must be one of {', '.join(MODES)}; got {self.int8_mode!r}")
        if not 0.0 < self.sparsity < 1.0:
            raise UserError(f"sparsity must be between 0 and 1 (exclusive), got {self.sparsity}")
        if not 0.0 <= self.alpha <= 1.0:
            raise UserError(f"alpha must be between 0 and 1, got {self.alpha}")
        for key in ("temperature", "student_hidden", "calibration", "threads", "repeats"):
            if getattr(self, key) <= 0:
                raise UserError(f"{key.replace('_', '-')} must be > 0, got {getattr(self, key)}")
        if self.epochs < 0 or self.lr < 0:
            raise UserError("epochs and lr must be >= 0 (0 = the default)")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise UserError(f"batch sizes must be positive integers, got {self.batch_sizes}")

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(m.strip() for m in self.method.split(",") if m.strip())
