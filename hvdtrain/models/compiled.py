"""torch.compile'd models: compiled block by block so Horovod's gradient hooks keep overlapping backward.

One compiled graph for the whole model has one backward: every parameter's gradient-accumulator hook (where
Horovod's DistributedOptimizer starts that parameter's allreduce) fires when it ends, so no allreduce overlaps
backward (benchmarks/results/2026-12-06-c-compile/). Compiling each block apart (regional compilation, what
DDPOptimizer does for DDP by splitting the graph at its buckets) gives one backward per block: the last
block's gradients are reduced while the earlier blocks' backward runs (benchmarks/results/
2026-12-06-d-compile-overlap/). `Module.compile()` compiles in place, so state_dict keys stay the plain
model's; files are written without `_orig_mod.` either way (output/plain_weights.py).
"""
from __future__ import annotations

import sys
from collections import Counter

import torch
from torch import nn

from hvdtrain.output.plain_weights import WRAPPER

# Containers that are never called themselves: their members are the blocks.
_UNCALLED = (nn.ModuleList, nn.ModuleDict)
_TOLD: set[str] = set()   # notes already written by this process


def compile_model(model: nn.Module, note: bool = True) -> nn.Module:
    """Compile `model` in place, one graph per block (see `regions`); returns `model`.

    A model compiled already is returned as it is: one the user wrapped in torch.compile keeps its single
    graph (a note, where `note`, says that overlap is lost and how to keep it). The first steps (and the
    first evaluation: no_grad and eval mode are compiled apart) are slow while the graphs compile; on CPU
    that needs a C++ compiler.

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> compile_model(net) is net, sorted(net.state_dict())[0]
        (True, '0.bias')
    """
    if hasattr(model, WRAPPER):
        _note_once(note, "a model already wrapped in torch.compile is one graph: its gradient allreduces all start "
                   "when its backward ends (no overlap); pass the plain model with --compile true instead")
        return model
    if is_compiled(model):
        return model
    blocks = regions(model) or [model]
    _allow_recompiles(blocks)
    for region in blocks:
        region.compile()
    return model


def regions(model: nn.Module) -> list[nn.Module]:
    """The blocks compiled apart: the model's children that hold parameters, looking inside ModuleLists and
    ModuleDicts, into a child that holds one (a transformer's encoder: its layers, not the whole stack) and
    through a child that holds all of them (a wrapper around the real model).

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.ModuleList([nn.Linear(8, 8)]), nn.Linear(8, 2))
        >>> [type(m).__name__ for m in regions(net)]
        ['Linear', 'Linear', 'Linear']
    """
    holders = [child for child in model.children() if any(True for _ in child.parameters())]
    found: list[nn.Module] = []
    for child in holders:
        only = len(holders) == 1 and not any(True for _ in model.parameters(recurse=False))
        kids = list(child.children())
        descend = isinstance(child, _UNCALLED) or any(isinstance(k, _UNCALLED) for k in kids) or (only and bool(kids))
        found += (regions(child) or [child]) if descend else [child]
    return found


def is_compiled(model: nn.Module) -> bool:
    """Whether torch.compile reached the model: wrapped, or any module compiled in place."""
    return hasattr(model, WRAPPER) or any(getattr(m, "_compiled_call_impl", None) is not None
                                          for m in model.modules())


def _allow_recompiles(blocks: list[nn.Module]) -> None:
    """Room in Dynamo's per-function cache for every block of one class (ResNet's 8 blocks share one forward,
    with 7 shapes) in training and in no_grad evaluation: past the limit (8) Dynamo runs the rest eagerly."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    needed = 3 * max(Counter(type(block) for block in blocks).values())
    setattr(config, name, max(getattr(config, name), needed))


def _note_once(note: bool, text: str) -> None:
    if note and text not in _TOLD:
        _TOLD.add(text)
        sys.stderr.write(f"hvdtrain: note: {text}\n")
