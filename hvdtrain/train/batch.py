"""Batches of any structure: moved to the device recursively, counted, described in errors.

Tensors anywhere inside tuples, lists, dicts, namedtuples and dataclasses are moved; anything else
(strings, ids, None) passes through untouched.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch


def to_device(batch: Any, device: torch.device) -> Any:
    """`batch` with every tensor on `device` (non_blocking: overlaps with compute from pinned memory).

    Example:
        >>> to_device({"x": torch.ones(2), "ids": ["a", "b"]}, torch.device("cpu"))["ids"]
        ['a', 'b']
    """
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        moved = {k: to_device(v, device) for k, v in batch.items()}
        if type(batch) is dict:
            return moved
        try:  # keep a mapping's own type (e.g. Hugging Face's BatchEncoding) when it rebuilds from a dict
            return type(batch)(moved)  # type: ignore[call-arg]
        except Exception:
            return moved
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(to_device(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(batch, **{f.name: to_device(getattr(batch, f.name), device)
                                             for f in dataclasses.fields(batch) if f.init})
    return batch


def first_tensor(value: Any) -> torch.Tensor | None:
    """The first tensor found depth-first (dict values in order): what 'the outputs' mean for metrics."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, Mapping):
        items: Any = ([value["logits"]] if "logits" in value else []) + list(value.values())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [getattr(value, f.name) for f in dataclasses.fields(value)]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        items = [getattr(value, "logits", None)] if hasattr(value, "logits") else []
    for item in items:
        found = first_tensor(item)
        if found is not None:
            return found
    return None


def batch_len(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor."""
    tensor = first_tensor(batch)
    if tensor is None or tensor.dim() == 0:
        raise TypeError(f"cannot count the samples of a batch of {describe(batch)}: it holds no batched tensor")
    return int(tensor.shape[0])


def describe(value: Any, depth: int = 0) -> str:
    """A short type description for error messages: `dict(features: Tensor[32, 64], label: Tensor[32])`."""
    if isinstance(value, torch.Tensor):
        return f"Tensor{list(value.shape)}"
    if depth >= 2:
        return type(value).__name__
    if isinstance(value, Mapping):
        inner = ", ".join(f"{k}: {describe(v, depth + 1)}" for k, v in list(value.items())[:6])
        return f"{type(value).__name__}({inner})"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(describe(v, depth + 1) for v in list(value)[:6])
        return f"{type(value).__name__}({inner})"
    return type(value).__name__
