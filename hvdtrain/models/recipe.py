"""How to rebuild a model that was not built from the config: the run folder's `model.json`.

A Trainer given the user's own `nn.Module` records its class (`module:qualname`) and its constructor
arguments, so `hvdtrain predict` and `hvdtrain compress` rebuild that architecture and load the trained
weights into it. The rule for the arguments, one for every class: each parameter of the class's
`__init__` is read back from the attribute of the same name (`self.width = width`), and must be a plain
Python literal (numbers, strings, booleans, None, and lists, tuples, dicts of them). A class that takes
`*args`/`**kwargs`, keeps an argument under another name, or lives where a fresh process cannot import it
(`__main__` of a script or notebook, a class defined inside a function) is recorded with the reason it
cannot be rebuilt; then `--model module:function` names a builder that returns it. Rebuilding loads the
weights strictly, so a rebuilt model that differs in any layer or shape is an error, never a silently
different architecture. Model code never imports Horovod.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from hvdtrain.errors import UserError, first_line
from hvdtrain.output.files import write_text

FILE = "model.json"
FORMAT = "hvdtrain-model/1"
FIX = "pass --model module:function, a builder (config, input_shape, num_classes) that returns the trained model"


@dataclass(frozen=True)
class ModelRecipe:
    """What model.json holds: the class, its arguments as Python literals, or why it cannot be rebuilt."""

    cls: str                                             # "module:qualname", as importable from a fresh process
    args: dict[str, str] = field(default_factory=dict)   # keyword -> repr of the value passed to __init__
    why_not: str = ""                                    # '' when rebuildable; else the reason, one clause
    source: str = ""                                     # the class's file: a hint when it does not import

    @property
    def name(self) -> str:
        """The class name, lowercased: the run folder's name starts with it (`widemlp-digits-...`)."""
        return self.cls.rpartition(":")[2].rpartition(".")[2].lower()

    @property
    def call(self) -> str:
        """The constructor call it rebuilds with, e.g. `user_models:WideMLP(width=24, depth=3)`."""
        return f"{self.cls}({', '.join(f'{key}={value}' for key, value in self.args.items())})"

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "class": self.cls, "args": self.args, "why_not": self.why_not,
                           "source": self.source}, indent=2) + "\n"

    def write(self, folder: str | Path) -> None:
        write_text(Path(folder) / FILE, self.to_json())

    def check(self, where: str | Path) -> type[nn.Module]:
        """The class, imported; raises the one-line UserError (why, and the fix) when it cannot be rebuilt."""
        if self.why_not:
            raise UserError(f"{where} was trained with the model {self.cls}, which hvdtrain cannot rebuild: "
                            f"{self.why_not}; {FIX}")
        return _import(self, where)

    def build(self, where: str | Path) -> nn.Module:
        """A new model of the recorded class and arguments (random init; the caller loads the weights)."""
        cls = self.check(where)
        args = {key: ast.literal_eval(value) for key, value in self.args.items()}
        try:
            model = cls(**args)
        except Exception as err:
            raise UserError(f"{where}: rebuilding {self.call} failed ({type(err).__name__}: {first_line(err, 160)}); "
                            f"{FIX}") from None
        if not isinstance(model, nn.Module):
            raise UserError(f"{where}: {self.call} did not return a torch.nn.Module; {FIX}")
        return model


def read(folder: str | Path) -> ModelRecipe | None:
    """The run folder's model.json, or None when it has none (a model built from its config.yaml)."""
    path = Path(folder) / FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        if record.get("format") != FORMAT:
            raise ValueError(f"format {record.get('format')!r}, expected {FORMAT!r}")
        return ModelRecipe(str(record["class"]), {str(k): str(v) for k, v in record["args"].items()},
                           str(record.get("why_not", "")), str(record.get("source", "")))
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise UserError(f"{path} is not a model record hvdtrain wrote ({first_line(err, 120)}); {FIX}") from None


def describe(model: nn.Module) -> ModelRecipe:
    """How to rebuild `model` from a fresh process (see the module docstring for the rule).

    Args:
        model: the plain model (not a torch.compile wrapper).
    Returns:
        A ModelRecipe: rebuildable (its `call` rebuilds the architecture), or with `why_not` set.
    Example:
        >>> describe(WideMLP(width=24)).call     # doctest: +SKIP
        'user_models:WideMLP(width=24, depth=2)'
    """
    cls = type(model)
    module, why_module = _importable_module(cls)
    spec = f"{module}:{cls.__qualname__}"
    source = str(getattr(sys.modules.get(cls.__module__), "__file__", "") or "")
    if why_module:
        return ModelRecipe(spec, why_not=why_module, source=source)
    args, why_args = _init_args(model)
    return ModelRecipe(spec, args if not why_args else {}, why_args, source)


def _importable_module(cls: type) -> tuple[str, str]:
    """The module a fresh process imports `cls` from, and why it cannot ('' when it can)."""
    module = cls.__module__
    if module == "__main__":
        # `python -m package.module` runs a module that another process can import under its real name.
        main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        if main_spec is None or not main_spec.name or main_spec.name == "__main__":
            return module, (f"its class {cls.__qualname__} is defined in __main__ (a script or notebook), which "
                            "another process cannot import: move it into a module")
        module = main_spec.name
    if "<locals>" in cls.__qualname__:
        return module, f"its class {cls.__qualname__} is defined inside a function: define it at a module's top level"
    found: Any = sys.modules.get(cls.__module__)
    for part in cls.__qualname__.split("."):
        found = getattr(found, part, None)
    if found is not cls:
        return module, (f"{module}.{cls.__qualname__} is no longer this class (redefined or replaced after the "
                        "model was built)")
    return module, ""


def _init_args(model: nn.Module) -> tuple[dict[str, str], str]:
    """Each __init__ parameter's value, read back from the attribute of the same name, as a Python literal."""
    cls = type(model)
    if cls.__init__ is nn.Module.__init__:
        return {}, ""
    try:
        parameters = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError) as err:
        return {}, f"the signature of {cls.__qualname__}.__init__ cannot be read ({first_line(err, 80)})"
    args: dict[str, str] = {}
    for parameter in parameters:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            star = "*" if parameter.kind == parameter.VAR_POSITIONAL else "**"
            return {}, f"{cls.__qualname__}.__init__ takes {star}{parameter.name}, whose values are not kept"
        if parameter.kind == parameter.POSITIONAL_ONLY:
            return {}, f"{cls.__qualname__}.__init__ takes `{parameter.name}` positionally only"
        found, value = _read_back(model, parameter.name)
        if not found:
            return {}, (f"{cls.__qualname__}.__init__ takes `{parameter.name}`, which the model does not keep as "
                        f"self.{parameter.name}")
        literal = _literal(value)
        if literal is None:
            return {}, (f"self.{parameter.name} is a {type(value).__name__}, not a plain value (number, string, "
                        "bool, None, or a list/tuple/dict of them)")
        args[parameter.name] = literal
    return args, ""


def _read_back(model: nn.Module, name: str) -> tuple[bool, Any]:
    """(found, value) of `model.<name>`: an instance attribute, a submodule/parameter/buffer (never a plain
    value) or a property; a class-level constant is not read, since it is not what the caller passed."""
    if name in vars(model):
        return True, vars(model)[name]
    for held in (model._modules, model._parameters, model._buffers):
        if name in held:
            return True, held[name]
    if isinstance(inspect.getattr_static(type(model), name, None), property):
        try:
            return True, getattr(model, name)
        except Exception:
            return False, None
    return False, None


def _literal(value: Any) -> str | None:
    """repr(value) when it reads back as an equal value of the same type (ast.literal_eval), else None."""
    if isinstance(value, nn.Module):
        return None
    try:
        text = repr(value)
        back = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return text if type(back) is type(value) and back == value else None


def _import(record: ModelRecipe, where: str | Path) -> type[nn.Module]:
    """The recorded class, imported in this process."""
    module_name, _, qualname = record.cls.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
    except Exception as err:  # ImportError, or the module's own code failing on import
        was = f" (trained from {record.source})" if record.source else ""
        raise UserError(f"{where}: cannot import {module_name}{was} to rebuild its model {record.cls} "
                        f"({type(err).__name__}: {first_line(err, 120)}): put its folder on PYTHONPATH, or "
                        f"{FIX}") from None
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if not (isinstance(found, type) and issubclass(found, nn.Module)):
        raise UserError(f"{where}: module {module_name} has no model class {qualname} (model.json names "
                        f"{record.cls}); {FIX}")
    return found
