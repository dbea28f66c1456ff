"""Resolve a built-in name or a user plug-in given as 'module.path:function'."""
from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from hvdtrain.errors import UserError


def resolve(spec: str, kind: str, builtins: dict[str, Callable[..., Any]]) -> Callable[..., Any]:
    if spec in builtins:
        return builtins[spec]
    if ":" not in spec:
        raise UserError(f"unknown {kind} '{spec}'; choose one of {', '.join(builtins)} "
                        f"or a plug-in 'module.path:function'")
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise UserError(f"cannot import module '{module_name}' for --{kind} {spec}: {err} "
                        "(is it on PYTHONPATH on every host?)") from None
    builder = getattr(module, attr, None)
    if not callable(builder):
        raise UserError(f"module '{module_name}' has no function '{attr}' for --{kind} {spec}")
    return builder
