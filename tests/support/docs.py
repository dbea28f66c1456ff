"""The docs' own checks (docs/_ext/hvdtrain_docs.py: flags the pages name, runnable blocks), for the doc tests."""
from __future__ import annotations

import importlib.util
from types import ModuleType

from .paths import ROOT


def load_docs_checks() -> ModuleType:
    """docs/_ext/hvdtrain_docs.py loaded as a module (docs/_ext is no package: Sphinx loads it by path too)."""
    spec = importlib.util.spec_from_file_location("hvdtrain_docs", ROOT / "docs" / "_ext" / "hvdtrain_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
