"""Export a model with torch.export (`.pt2`), load it back with plain torch, and check its outputs."""
from __future__ import annotations

import io
import logging
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hvdtrain.errors import UserError, first_line
from hvdtrain.output.files import atomic_write

# Any batch size from 1 up: the exported graph keeps the batch dimension symbolic.
MAX_BATCH = 1 << 16


def quiet_torchao() -> None:
    """On import torchao logs that its CUDA-only kernels do not load on a CPU build (harmless) and trips a
    deprecation log of torch's pytree: keep both out of the user's console."""
    logging.getLogger("torchao").setLevel(logging.ERROR)
    pytree = logging.getLogger("torch.utils._pytree")
    level = pytree.level
    pytree.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torchao  # noqa: F401
    except ImportError:
        pass
    finally:
        pytree.setLevel(level)


@contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """A model torch.export cannot trace makes it log a warning and print its whole graph to stderr; the
    error raised says enough, so both are held back (stderr is kept and shown only if export succeeds)."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    held = io.StringIO()
    failed = False
    try:
        with redirect_stderr(held):
            yield
    except BaseException:
        failed = True
        raise
    finally:
        log.setLevel(level)
        if not failed and held.getvalue():
            sys.stderr.write(held.getvalue())


def export_program(model: nn.Module, example: torch.Tensor) -> torch.export.ExportedProgram:
    """torch.export of `model` (eval mode) with a dynamic batch dimension.

    Args:
        model: an nn.Module; torchao int8 tensors and PT2E graphs export too.
        example: a batch of inputs (batch >= 2, so the batch size is not specialised).
    Returns:
        The ExportedProgram.
    Example:
        >>> program = export_program(model.eval(), torch.rand(8, 1, 8, 8))
    """
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    if not isinstance(model, torch.fx.GraphModule):  # an exported graph (PT2E) has no train/eval switch
        model.eval()
    with torch.no_grad(), _quiet("torch.fx.experimental.symbolic_shapes"):
        return torch.export.export(model, (example,), dynamic_shapes=({0: batch},))


def program_bytes(program: torch.export.ExportedProgram) -> int:
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    return len(buffer.getvalue())


def save_program(program: torch.export.ExportedProgram, path: str | Path) -> Path:
    """Write the program atomically; it loads with `torch.export.load(path).module()`, no hvdtrain needed."""
    return atomic_write(path, lambda handle: torch.export.save(program, handle))


class ExportedModel(nn.Module):
    """An exported program as an ordinary inference module: `eval()` / `train()` are accepted (the graph was
    exported in eval mode and stays so), so `Trainer(model, ...).predict(data)` and `.evaluate()` take it."""

    def __init__(self, graph: nn.Module) -> None:
        super().__init__()
        self.graph = graph

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.graph(inputs)

    def train(self, mode: bool = True) -> ExportedModel:
        self.training = mode  # the graph's own behaviour was fixed (eval) at export
        return self


def load_exported(path: str | Path) -> ExportedModel:
    """The callable module of an exported `.pt2` file.

    Args:
        path: a `model.pt2` written by `hvdtrain compress`.
    Returns:
        An ExportedModel (an nn.Module); call it on a batch of inputs.
    Example:
        >>> model = load_exported("runs/mlp-int8/model.pt2")
        >>> model(torch.rand(4, 1, 8, 8)).shape
    """
    quiet_torchao()  # an int8 program's ops live in torchao, which torch.export.load imports
    try:
        graph = torch.export.load(str(path)).module()
    except Exception as err:
        raise UserError(f"cannot load exported model {path}: {first_line(err)}") from None
    return ExportedModel(graph)


@torch.no_grad()
def max_difference(first: Any, second: Any, inputs: torch.Tensor) -> float:
    """Largest absolute difference of two models' outputs on the same inputs."""
    return float((first(inputs) - second(inputs)).abs().max().item())
