"""The search space: a YAML mapping of TrainConfig keys to distributions, parsed and checked before any trial.

```yaml
lr:         {type: float, low: 0.01, high: 0.3, log: true}
batch_size: {type: categorical, choices: [16, 32, 64]}
hidden:     {type: int, low: 64, high: 256, step: 64}
```

Pure: no Optuna, no Horovod. Every mistake is a ConfigError naming the file and key (one line, exit 2).
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from hvdtrain.config.train_config import FIELD_TYPES, TrainConfig, coerce, load_config
from hvdtrain.config.yaml_file import load_yaml_file
from hvdtrain.errors import ConfigError

TYPES = ("float", "int", "categorical")
# The tune command owns these per trial (where it writes, what it resumes); a space cannot vary them.
NOT_TUNABLE = ("run_dir", "name", "resume", "elastic", "timeline_file")
_FIELDS = {"float": {"type", "low", "high", "log", "step"}, "int": {"type", "low", "high", "log", "step"},
           "categorical": {"type", "choices"}}


@dataclass(frozen=True)
class Param:
    """One searched key: a float or int range (optionally log-scaled or stepped) or a list of choices."""
    key: str
    type: str
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()

    def distribution(self) -> Any:
        """The Optuna distribution (imported here so parsing needs no Optuna)."""
        from optuna import distributions

        if self.type == "float":
            return distributions.FloatDistribution(self.low, self.high, log=self.log, step=self.step)
        if self.type == "int":
            return distributions.IntDistribution(int(self.low), int(self.high), log=self.log,
                                                 step=int(self.step or 1))
        return distributions.CategoricalDistribution(self.choices)

    def describe(self) -> str:
        if self.type == "categorical":
            return f"{self.key} in {list(self.choices)}"
        scale = " log" if self.log else ""
        step = f" step {self.step:g}" if self.step else ""
        return f"{self.key} {self.type}{scale} [{self.low:g}, {self.high:g}]{step}"


def parse_space(data: Any, source: str = "space") -> dict[str, Param]:
    """Check a loaded YAML mapping and turn it into Params, in file order.

    Args:
        data: the mapping `{config key: {type: ..., ...}}`.
        source: the file name, for error messages.
    Returns:
        {key: Param}.
    Raises:
        ConfigError: unknown or untunable key, unknown type or field, empty range, bad choices.
    Example:
        >>> parse_space({"lr": {"type": "float", "low": 0.01, "high": 0.3, "log": True}})["lr"].log
        True
    """
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{source}: must be a non-empty mapping of config key: {{type: ..., ...}}")
    space = {}
    for raw_key, spec in data.items():
        key = str(raw_key).replace("-", "_")
        where = f"{source}: {key}"
        if key not in FIELD_TYPES:
            close = difflib.get_close_matches(key, FIELD_TYPES, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{source}: unknown config key {key!r}{hint}")
        if key in NOT_TUNABLE:
            raise ConfigError(f"{where}: cannot be searched (hvdtrain tune sets it per trial)")
        space[key] = _param(key, spec, where)
    return space


def _param(key: str, spec: Any, where: str) -> Param:
    if not isinstance(spec, dict) or "type" not in spec:
        raise ConfigError(f"{where}: must be a mapping with a type (float, int or categorical), got {spec!r}")
    kind = spec["type"]
    if kind not in TYPES:
        raise ConfigError(f"{where}: unknown distribution type {kind!r}; use float, int or categorical "
                          "(log scale: type float with log: true)")
    extra = sorted(str(field) if str(field).isprintable() else repr(field) for field in set(spec) - _FIELDS[kind])
    if extra:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(extra)} for type {kind} "
                          f"(allowed: {', '.join(sorted(_FIELDS[kind]))})")
    field = FIELD_TYPES[key]
    if kind == "categorical":
        return _categorical(key, spec, where, field)
    if field is not (float if kind == "float" else int):
        name = getattr(field, "__name__", str(field))
        raise ConfigError(f"{where}: is of type {name}, so a {kind} range cannot set it "
                          f"({'use type int' if field is int else 'use type categorical'})")
    for bound in ("low", "high"):
        value = spec.get(bound)
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: {bound} must be a number, got {value!r}")
        if kind == "int" and not isinstance(value, int):
            raise ConfigError(f"{where}: {bound} must be an integer for type int, got {value!r}")
        if not _finite(value):
            raise ConfigError(f"{where}: {bound} must be a finite number below 1e300, got {value!r}")
    low, high, log, step = spec["low"], spec["high"], spec.get("log", False), spec.get("step")
    if low >= high:
        raise ConfigError(f"{where}: empty range: low {low} must be below high {high}")
    if not isinstance(log, bool):
        raise ConfigError(f"{where}: log must be true or false, got {log!r}")
    if log and low <= 0:
        raise ConfigError(f"{where}: a log range needs low > 0, got {low}")
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not _finite(step) or step <= 0 or (
                kind == "int" and not isinstance(step, int)):
            raise ConfigError(f"{where}: step must be a positive {'integer' if kind == 'int' else 'number'}, "
                              f"got {step!r}")
        if log:
            raise ConfigError(f"{where}: step and log cannot be combined")
        span = (high - low) / step
        if abs(span - round(span)) > 1e-9:
            raise ConfigError(f"{where}: high - low ({high - low:g}) must be a multiple of step {step:g}")
    return Param(key, kind, float(low), float(high), log, float(step) if step is not None else None)


def _finite(value: float) -> bool:
    """Not nan or inf, and small enough that (high - low) / step is a float (10**400 is not)."""
    return abs(value) < 1e300  # False for nan and inf; compares a huge int without converting it


def _categorical(key: str, spec: dict[str, Any], where: str, field: Any) -> Param:
    choices = spec.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ConfigError(f"{where}: choices must be a non-empty list, got {choices!r}")
    values = []
    for choice in choices:
        value = coerce(key, choice)  # raises "batch_size must be an integer, got 'x'"
        # Optuna stores plain scalars: tuple-valued keys travel as "1,28,28" and are coerced back per trial.
        values.append(",".join(map(str, value)) if isinstance(value, tuple) else value)
    if len(set(map(repr, values))) != len(values):
        raise ConfigError(f"{where}: choices repeat a value: {choices!r}")
    return Param(key, "categorical", choices=tuple(values))


def load_space(path: str) -> dict[str, Param]:
    """Read and parse a space YAML file (see parse_space)."""
    data = load_yaml_file(path, "space file", "--space")
    return parse_space(data, f"space {path}")


def check_against(space: dict[str, Param], base: TrainConfig) -> None:
    """Every bound and choice must make a valid config with `base` (e.g. lr low 0 fails here, not in trial 7)."""
    for param in space.values():
        edges = param.choices if param.type == "categorical" else (param.low, param.high)
        for value in edges:
            value = int(value) if param.type == "int" else value
            try:
                trial_config(base, {param.key: value})
            except ConfigError as err:
                raise ConfigError(f"space: {param.key} = {value!r} makes an invalid config: {err}") from None


def trial_config(base: TrainConfig, params: dict[str, Any], **fixed: Any) -> TrainConfig:
    """`base` with a trial's parameters (and the tune command's own keys, e.g. run_dir, name) applied.

    Example:
        >>> trial_config(load_config(), {"lr": 0.1}, name="trial-0003").lr
        0.1
    """
    return load_config(**{**base.to_dict(), **params, **fixed})
