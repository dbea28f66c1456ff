"""`hvdtrain doctor`'s GPU verdicts: pure functions of what was found, so they are tested without a GPU.

Each problem is one line naming the fix. None of these paths has run on a GPU in this project yet.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

# The oldest Linux driver each CUDA major version runs on (NVIDIA's CUDA compatibility table).
MIN_DRIVER = {11: 450, 12: 525, 13: 580}


def major_minor(version: str | None) -> tuple[int, int] | None:
    """'12.8' / 'release 12.8, V12.8.93' / '580.65.06' -> (12, 8) / (12, 8) / (580, 65)."""
    match = re.search(r"(\d+)\.(\d+)", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def parse_nvcc_release(text: str) -> str | None:
    """The CUDA release `nvcc --version` names ('Cuda compilation tools, release 12.8, V12.8.93' -> '12.8')."""
    match = re.search(r"release (\d+\.\d+)", text)
    return match.group(1) if match else None


def gpu_problems(info: dict[str, Any]) -> list[str]:
    """GPU problems of an otherwise working install. Keys read (absent = unknown, no verdict):
    cuda (torch.version.cuda), gpus (what torch sees), smi_gpus and driver (from nvidia-smi),
    nvcc (the CUDA release of nvcc), built (Horovod's build flags).

    Example:
        >>> gpu_problems({"cuda": "13.0", "gpus": 0, "smi_gpus": 2, "driver": "550.54"})[0][:40]
        'torch (CUDA 13.0) sees no GPU though nvi'
    """
    problems = []
    cuda, gpus = info.get("cuda"), info.get("gpus") or 0
    smi_gpus, driver = info.get("smi_gpus") or 0, info.get("driver")
    if cuda and smi_gpus and not gpus:
        need = MIN_DRIVER.get((major_minor(cuda) or (0, 0))[0])
        too_old = need is not None and driver and (major_minor(driver) or (0, 0))[0] < need
        why = (f"driver {driver} is too old for CUDA {cuda} (needs >= {need}); update the driver or install a "
               "torch built for an older CUDA (TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128)"
               if too_old else "check the driver and CUDA_VISIBLE_DEVICES")
        problems.append(f"torch (CUDA {cuda}) sees no GPU though nvidia-smi lists {smi_gpus}: --device auto would "
                        f"train on CPU; {why}")
    if gpus and cuda and not info.get("built", {}).get("nccl"):
        problems.append(f"{gpus} GPU(s) visible but Horovod was built without NCCL: GPU tensors would be reduced "
                        "through host memory; install libnccl-dev (or set HOROVOD_NCCL_HOME) and re-run "
                        "scripts/install-horovod --force")
    nvcc = info.get("nvcc")
    if cuda and nvcc and (major_minor(nvcc) or (0, 0))[0] != (major_minor(cuda) or (0, 0))[0]:
        problems.append(f"nvcc is CUDA {nvcc} but torch is built for CUDA {cuda}: Horovod's GPU code would be "
                        "compiled for another CUDA; put the matching toolkit first on PATH (or CUDA_HOME) and rebuild")
    return problems


def no_device_message(torch_version: str, cuda: str | None, facts: dict[str, Any]) -> str:
    """`doctor --gpu`'s one line when torch sees no GPU, with the reason when nvidia-smi knows one (a driver too
    old for torch's CUDA is the usual one on a GPU host).

    Example:
        >>> line = no_device_message("2.13.0", "13.0", {"smi_gpus": 1, "driver": "535.1"})
        >>> "driver 535.1 is too old for CUDA 13.0" in line
        True
    """
    build = f", CUDA {cuda}" if cuda else ", CPU build"
    problems = gpu_problems({"cuda": cuda, "gpus": 0, **facts})
    reason = problems[0] if problems else "doctor --gpu needs GPUs and a CUDA torch"
    return f"hvdtrain: error: no CUDA device (torch {torch_version}{build}): {reason}"


def gpu_facts(timeout: float = 10.0) -> dict[str, Any]:
    """nvidia-smi's GPU count and driver, and nvcc's CUDA release; None where the tool is absent."""
    facts: dict[str, Any] = {"smi_gpus": None, "driver": None, "nvcc": None}
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=timeout).stdout.split()
            facts["smi_gpus"], facts["driver"] = len(out), out[0] if out else None
        except (OSError, subprocess.TimeoutExpired):
            pass
    if shutil.which("nvcc"):
        try:
            facts["nvcc"] = parse_nvcc_release(subprocess.run(["nvcc", "--version"], capture_output=True,
                                                              text=True, timeout=timeout).stdout)
        except (OSError, subprocess.TimeoutExpired):
            pass
    return facts
