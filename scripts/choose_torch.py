"""Which torch build `make setup` installs, and from where; run by scripts/setup-env before the venv has torch.

Why: PyPI's torch for Linux x86_64 is a CUDA build (several GB with its NVIDIA libraries). On a machine
without an NVIDIA GPU that is wasted space, so set-up takes the CPU build from PyTorch's CPU index when
that index answers, and falls back to the default index (PyPI) when it does not, saying which. A
TORCH_INDEX_URL the user gives always wins. An existing venv whose torch is the other build (CPU vs CUDA)
is switched: pip alone would call the installed one "already satisfied".

Standard library only (and its sibling install_horovod.py). Prints three lines for setup-env: the index
('' = the default), whether to remove the installed torch first (0/1), and the one line to show the user.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

# A sibling script: scripts/ is sys.path[0] when setup-env runs this file, and tests put it there.
from install_horovod import InstallError, probe_torch

CPU_INDEX_URL = "https://download.pytorch.org/whl/cpu"


@dataclass(frozen=True)
class Choice:
    index_url: str          # '' = pip's default index
    remove_first: bool      # the installed torch is the other build (CPU vs CUDA)
    message: str


def build_of_index(index_url: str) -> str | None:
    """'cpu' / 'cuda' for PyTorch's own indexes (…/whl/cpu, …/whl/cu128), None for any other."""
    tail = index_url.rstrip("/").rsplit("/", 1)[-1]
    if tail == "cpu":
        return "cpu"
    return "cuda" if re.fullmatch(r"cu\d+", tail) else None


def choose(spec: str, index_url: str, has_gpu: bool, cpu_index: str, cpu_index_reachable: bool,
           installed: str | None) -> Choice:
    """The pure decision. `installed` is the venv's torch build ('cpu'/'cuda') or None when it has none.

    Example:
        >>> choose("torch==2.13.0", "", False, CPU_INDEX_URL, True, None).index_url
        'https://download.pytorch.org/whl/cpu'
    """
    if index_url:
        wanted, where = build_of_index(index_url), index_url
        message = f"installing {spec} from {index_url} (TORCH_INDEX_URL)"
    elif has_gpu:
        wanted, where = "cuda", ""
        message = f"installing {spec} from the default index (an NVIDIA GPU is present: a CUDA build)"
    elif cpu_index and cpu_index_reachable:
        wanted, where = "cpu", cpu_index
        message = f"installing {spec}, the CPU build from {cpu_index} (no NVIDIA GPU on this machine)"
    else:
        wanted, where = None, ""
        reason = f"{cpu_index} cannot be reached" if cpu_index else "TORCH_CPU_INDEX_URL is empty"
        message = (f"installing {spec} from the default index: no NVIDIA GPU, but {reason} (on Linux x86_64 "
                   "PyPI's torch is a CUDA build of several GB; Horovod is then built for CPU)")
    remove_first = bool(installed and wanted and installed != wanted)
    if remove_first:
        message += f"; replacing the installed {installed} build"
    return Choice(where, remove_first, message)


def has_nvidia_gpu() -> bool:
    """An NVIDIA GPU the driver knows: nvidia-smi lists one, or /proc/driver/nvidia/gpus has an entry."""
    gpus = Path("/proc/driver/nvidia/gpus")
    if gpus.is_dir() and any(gpus.iterdir()):
        return True
    try:
        proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and "GPU" in proc.stdout


def reachable(index_url: str, timeout_s: float = 5.0) -> bool:
    """Whether the index answers for torch within a few seconds (DNS failure and refusals are immediate)."""
    try:
        with urllib.request.urlopen(f"{index_url.rstrip('/')}/torch/", timeout=timeout_s) as response:
            return response.status < 400
    except (urllib.error.URLError, OSError, ValueError):
        return False


def installed_build(python: str) -> str | None:
    """'cpu' / 'cuda' for the torch `python` imports; None without that python or without torch."""
    if not os.path.exists(python):
        return None
    try:
        _, cuda = probe_torch(python)
    except InstallError:
        return None
    return "cuda" if cuda else "cpu"


def main(argv: list[str]) -> int:
    spec, index_url, venv_python = argv
    cpu_index = os.environ.get("TORCH_CPU_INDEX_URL", CPU_INDEX_URL)
    gpu = False if index_url else has_nvidia_gpu()
    choice = choose(spec, index_url, gpu, cpu_index,
                    bool(cpu_index) and not index_url and not gpu and reachable(cpu_index),
                    installed_build(venv_python))
    print(choice.index_url)
    print(int(choice.remove_first))
    print(choice.message)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
