"""`hvdtrain doctor` on the real install, and on simulated broken installs."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hvdtrain.cli.doctor import FIX, diagnose

GOOD = {"python": "3.11.7", "torch": "2.13.0+cpu", "cuda": None, "gpus": 0, "horovod": "0.28.1",
        "horovod_built_against_torch": "2.13.0+cpu", "mpirun": "mpirun (Open MPI) 4.1.4",
        "extension_error": None, "built": {"mpi": True, "gloo": True, "nccl": False}}


def doctor(env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hvdtrain", "doctor"], capture_output=True, text=True,
                          timeout=120, env=env)


def test_doctor_on_the_real_install_reports_versions_and_backends():
    import torch

    proc = doctor()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"torch: {torch.__version__}" in out
    assert "horovod: 0.28.1" in out
    assert f"built against torch: {torch.__version__}" in out
    assert "controllers: MPI, Gloo" in out and "tensor ops: MPI, Gloo" in out
    assert "mpirun: mpirun (Open MPI)" in out
    assert f"visible GPUs: {gpus_by_driver() if torch.version.cuda else 0}" in out   # a CPU torch uses none
    assert out.strip().endswith("hvdtrain: ready")
    hidden = doctor({**os.environ, "CUDA_VISIBLE_DEVICES": ""})       # the count follows what this process may use
    assert "visible GPUs: 0" in hidden.stdout, hidden.stdout + hidden.stderr


def gpus_by_driver() -> int:
    """The GPUs this process may use, counted without torch (the doctor's own source, so comparing with
    torch.cuda.device_count() would agree with anything): the driver's list narrowed by CUDA_VISIBLE_DEVICES;
    0 with no driver."""
    import shutil
    if shutil.which("nvidia-smi") is None:
        return 0
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    count = sum(line.startswith("GPU ") for line in listed.splitlines())
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return count if visible is None else len([d for d in visible.split(",") if d.strip()][:count])


@pytest.mark.parametrize("change, message", [
    ({"horovod": None}, "Horovod is not installed"),
    ({"horovod_built_against_torch": "2.0.1"}, "built against torch 2.0.1 but torch 2.13.0+cpu is installed"),
    ({"extension_error": "No module named 'horovod.torch.mpi_lib_v2'"}, "PyTorch extension is missing"),
    ({"horovod_built_against_torch": None}, "no PyTorch entry in horovod/metadata.json"),
    ({"built": {"mpi": False, "gloo": False}}, "neither MPI nor Gloo"),
])
def test_diagnose_names_each_problem_and_the_fix(change, message):
    problems = diagnose({**GOOD, **change})
    assert len(problems) == 1 and message in problems[0] and FIX in problems[0]
    assert diagnose(GOOD) == []


def _fake_horovod(tmp_path, metadata):
    pkg = tmp_path / "horovod"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("__version__ = '0.28.1'\n")
    (pkg / "metadata.json").write_text(json.dumps(metadata))
    return dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")


def test_doctor_exits_non_zero_on_a_torch_mismatch(tmp_path):
    proc = doctor(_fake_horovod(tmp_path, {"pytorch": "2.0.1"}))
    assert proc.returncode == 1
    errors = [line for line in proc.stdout.splitlines() if line.startswith("hvdtrain: error:")]
    assert len(errors) == 1 and "built against torch 2.0.1" in errors[0] and "make setup" in errors[0]


def test_doctor_exits_non_zero_when_the_torch_extension_is_missing(tmp_path):
    import torch

    proc = doctor(_fake_horovod(tmp_path, {"pytorch": torch.__version__}))
    assert proc.returncode == 1
    assert "hvdtrain: error: Horovod's PyTorch extension is missing or broken" in proc.stdout


def test_a_hanging_mpirun_is_reported_not_waited_on(tmp_path):
    """Review defect: doctor ran `mpirun --version` without a timeout (a broken MPI hung it)."""
    import time

    from hvdtrain.cli.doctor import mpirun_version

    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\nsleep 30\n")
    fake.chmod(0o755)
    start = time.monotonic()
    assert "no answer from" in mpirun_version(str(fake), timeout=1)
    assert time.monotonic() - start < 10
