"""What weights files hold: the plain model's state_dict, whatever torch.compile wrapped.

`torch.compile(model)` wraps the model in an OptimizedModule whose state_dict keys all start with
`_orig_mod.` (a compiled submodule inside a container gets `_orig_mod.` in the middle of its keys). Files
written with those keys do not load into the plain model, so hvdtrain writes the plain keys and, when
loading, accepts either spelling into a compiled or a plain model.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

WRAPPER = "_orig_mod"   # the attribute (and state_dict key part) torch.compile adds


def plain(model: nn.Module) -> nn.Module:
    """The module beneath a top-level torch.compile wrapper (the model itself when not compiled).

    Example:
        >>> import torch
        >>> net = nn.Linear(2, 2)
        >>> plain(torch.compile(net)) is net, plain(net) is net
        (True, True)
    """
    return getattr(model, WRAPPER, model)


def plain_key(key: str) -> str:
    """A state_dict key without torch.compile's `_orig_mod` parts.

    Example:
        >>> plain_key("_orig_mod.0.weight"), plain_key("encoder._orig_mod.fc.bias"), plain_key("fc.bias")
        ('0.weight', 'encoder.fc.bias', 'fc.bias')
    """
    return ".".join(part for part in key.split(".") if part != WRAPPER)


def plain_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """`state` with every key spelled as the plain model spells it (older files may carry `_orig_mod.`)."""
    return {plain_key(key): value for key, value in state.items()}


def plain_state_dict(model: nn.Module) -> dict[str, Any]:
    """The model's state_dict as the uncompiled model has it: what weights files and checkpoints hold."""
    return plain_state(plain(model).state_dict())


def load_plain_state(model: nn.Module, state: Mapping[str, Any], strict: bool = True) -> Any:
    """model.load_state_dict(state), whichever of model and state went through torch.compile.

    Keys are matched by their plain spelling; a key the model does not have is passed on unchanged, so a
    strict load still names it. Returns what load_state_dict returns (missing and unexpected keys).
    """
    own = {plain_key(key): key for key in model.state_dict()}
    renamed = {own.get(plain_key(key), key): value for key, value in state.items()}
    return model.load_state_dict(renamed, strict=strict)


class PlainWeights:
    """The model as a stateful component (checkpoint/stateful.py): its weights under the plain keys, loaded into a
    compiled or a plain model alike."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        return plain_state_dict(self.model)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        load_plain_state(self.model, state)
