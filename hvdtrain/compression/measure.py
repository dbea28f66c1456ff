"""What a model costs and how well it does: parameters, bytes, latency, held-out accuracy (no Horovod)."""
from __future__ import annotations

import io
import statistics
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

# PT2E keeps quantization scales and zero points as _scale_N / _zero_point_N buffers. They are not weights:
# bytes on disk counts them, parameters do not. (torchao's int8 weights carry theirs inside the tensor.)
_QPARAM_PREFIXES = ("_scale_", "_zero_point_")


def count_params(model: nn.Module) -> int:
    """Weights and biases (logical elements; an int8 weight counts like an fp32 one), no quantization scales.

    Args:
        model: any module, including torchao-quantized ones and PT2E GraphModules.
    Returns:
        The number of elements.
    Example:
        >>> count_params(torch.nn.Linear(3, 2))
        8
    """
    total = 0
    for name, tensor in model.state_dict().items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf.startswith(_QPARAM_PREFIXES):
            continue
        if "running_" in leaf or leaf == "num_batches_tracked":
            continue  # BatchNorm statistics are buffers, not learned weights
        total += tensor.numel()
    return total


def saved_bytes(obj: Any) -> int:
    """Size of `torch.save(obj)`: what the state_dict file of a model takes on disk."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return len(buffer.getvalue())


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run the block with exactly `threads` intra-op threads (latency depends on it), then restore."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


@torch.no_grad()
def latency_ms(model: Any, sample_shape: tuple[int, ...], batch: int, *, threads: int, repeats: int,
               warmup: int = 3) -> float:
    """Median wall time of one forward pass of `batch` random inputs, in milliseconds.

    Args:
        model: a callable module in eval mode.
        sample_shape: one input's shape, without the batch dimension.
        threads: torch intra-op threads while timing (report it beside the number).
        repeats: timed passes; the median is robust to the noise of a shared machine.
    Returns:
        The median, in ms.
    Example:
        >>> latency_ms(torch.nn.Linear(64, 10), (64,), 1, threads=1, repeats=20)
    """
    inputs = torch.rand(batch, *sample_shape, generator=torch.Generator().manual_seed(0))
    times = []
    with torch_threads(threads):
        for _ in range(warmup):
            model(inputs)
        for _ in range(repeats):
            start = time.perf_counter()
            model(inputs)
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000.0


def compiled_latency_ms(model: Any, sample_shape: tuple[int, ...], batch_sizes: tuple[int, ...], *, threads: int,
                        repeats: int) -> tuple[dict[str, float], float]:
    """Latency after `torch.compile` (inductor with freezing: weights become constants, which lets it fuse int8
    quantize/dequantize into int8 kernels), one compiled graph per batch size.

    Args:
        model: a callable module in eval mode.
        batch_sizes: one compile (a few seconds to a minute on a small CPU) and one timing per size.
    Returns:
        ({batch size: median ms}, seconds spent compiling and warming up).
    Example:
        >>> compiled_latency_ms(model, (1, 8, 8), (1, 64), threads=1, repeats=30)
    """
    import torch._inductor.config as inductor

    result = {}
    spent = 0.0
    # Inductor's int8 lowering warns about its own tensor copies; nothing the user can act on.
    with inductor.patch(freezing=True), torch.no_grad(), torch_threads(threads), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        fast = torch.compile(model, dynamic=False)
        for batch in batch_sizes:
            begin = time.perf_counter()
            fast(torch.rand(batch, *sample_shape))  # compiles for this shape
            spent += time.perf_counter() - begin
            result[str(batch)] = latency_ms(fast, sample_shape, batch, threads=threads, repeats=repeats)
    return result, spent


@torch.no_grad()
def outputs_of(model: Any, dataset: Any, batch_size: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """(outputs, labels) for every sample of a dataset of (input, label) pairs, in order."""
    outs, labels = [], []
    for inputs, targets in DataLoader(dataset, batch_size=batch_size):
        outs.append(model(inputs))
        labels.append(targets)
    return torch.cat(outs), torch.cat(labels)


def accuracy(model: Any, dataset: Any, batch_size: int = 256) -> float:
    """Share of samples whose largest output is the label (the held-out split, measured now)."""
    outputs, labels = outputs_of(model, dataset, batch_size)
    return float((outputs.argmax(1) == labels).float().mean().item())
