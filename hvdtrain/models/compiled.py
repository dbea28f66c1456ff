"""torch.compile'd models: trained compiled, saved and loaded as the plain model (output/plain_weights.py)."""
from __future__ import annotations

import torch
from torch import nn

from hvdtrain.output.plain_weights import WRAPPER


def compile_model(model: nn.Module) -> nn.Module:
    """torch.compile(model), once: a model the user compiled already is returned as it is.

    The first steps (and the first evaluation: no_grad and eval mode are compiled apart) are slow while
    the graphs compile; on CPU that needs a C++ compiler.
    """
    if hasattr(model, WRAPPER):
        return model
    compiled: nn.Module = torch.compile(model)  # type: ignore[assignment]  # an OptimizedModule
    return compiled
