"""Reading a YAML file a user named (configs, tune spaces): one-line errors that name the file and its flag."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hvdtrain.errors import ConfigError


def load_yaml_file(path: str, what: str, flag: str) -> Any:
    """The parsed YAML document of `path`, or a one-line ConfigError naming `what` file and its `flag`.

    Example:
        >>> load_yaml_file("space.yaml", "space file", "--space")
    """
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{what} {path} does not exist (check the {flag} path)")
    try:
        return yaml.safe_load(file.read_text())
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path} is not UTF-8 text (check the {flag} path)") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise ConfigError(f"{what} {path}{where}: YAML syntax error: {problem}") from None
