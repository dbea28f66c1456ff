"""Where things are: the checkout, the venv's bin/ (horovodrun, hvdtrain) and the tests' plug-ins."""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# Plug-ins that tests name as 'module:function' (conftest.py also puts the folder on this process's sys.path).
PLUGINS_DIR = ROOT / "tests" / "plugins"
# For a child process (horovodrun's workers, a CLI run) that imports them: the folder before any PYTHONPATH already
# set, read once at import.
PLUGINS = {"PYTHONPATH": os.pathsep.join(filter(None, [str(PLUGINS_DIR), os.environ.get("PYTHONPATH")]))}
