"""Issue 32 items 8 and the one-command GPU check: doctor's GPU verdicts (pure), and `hvdtrain doctor --gpu`
on a machine without CUDA (this one): one line, non-zero, at once. The GPU run itself is skipped here."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hvdtrain.cli.gpu_check import TOO_MANY, expected_error, gpu_steps
from hvdtrain.cli.gpu_verdicts import gpu_problems, major_minor, parse_nvcc_release

ROOT = Path(__file__).resolve().parents[2]
READY = {"cuda": "13.0", "gpus": 2, "smi_gpus": 2, "driver": "580.65.06", "nvcc": "13.0", "built": {"nccl": True}}


def test_a_complete_gpu_install_has_no_problems():
    assert gpu_problems(READY) == []
    assert gpu_problems({"cuda": None, "gpus": 0}) == []          # a CPU torch: nothing to say about GPUs


def test_gpus_visible_and_no_nccl_is_not_ready():
    (problem,) = gpu_problems(dict(READY, built={"mpi": True, "gloo": True}))
    assert problem.startswith("2 GPU(s) visible but Horovod was built without NCCL") and "libnccl-dev" in problem


def test_a_driver_too_old_for_torch_cuda_is_named_not_silently_cpu():
    (problem,) = gpu_problems(dict(READY, gpus=0, driver="550.54.15"))
    assert "sees no GPU though nvidia-smi lists 2" in problem and "--device auto would train on CPU" in problem
    assert "driver 550.54.15 is too old for CUDA 13.0 (needs >= 580)" in problem
    (other,) = gpu_problems(dict(READY, gpus=0))                   # new driver, still no GPU: no false blame
    assert "too old" not in other and "CUDA_VISIBLE_DEVICES" in other


def test_nvcc_of_another_cuda_major_than_torch():
    (problem,) = gpu_problems(dict(READY, nvcc="12.8"))
    assert problem.startswith("nvcc is CUDA 12.8 but torch is built for CUDA 13.0")
    assert gpu_problems(dict(READY, nvcc="13.1")) == []            # minor versions are compatible
    assert parse_nvcc_release("Cuda compilation tools, release 12.8, V12.8.93") == "12.8"
    assert parse_nvcc_release("bash: nvcc: not found") is None and major_minor("580.65.06") == (580, 65)


def test_every_problem_is_one_line():
    worst = dict(READY, gpus=0, driver="470.1", nvcc="11.8", built={})
    assert all("\n" not in p for p in gpu_problems(worst)) and gpu_problems(worst)


def test_gpu_steps_cover_every_path_and_hybrid_only_with_two_gpus(tmp_path):
    one = [name for name, _ in gpu_steps(1, tmp_path)]
    four = [name for name, _ in gpu_steps(4, tmp_path)]
    assert one == ["doctor (NCCL)", "one rank fp32", "one rank bf16", "one rank fp16",
                   "SyncBN resnet18 (BatchNorm), 1 GPU(s)", "data parallel, 1 GPU(s) (NCCL)",
                   "fp16 gradients on the wire, 1 GPU(s)", "fp16 loss scaler + allreduce, 1 GPU(s)",
                   "2 ranks on 1 GPU(s) refused", "compress prune on GPU", "compress distill on GPU", "predict",
                   "benchmark np=1 vs plain loop"]
    assert {"hybrid --stages 2, 2 worker(s)", "hybrid --stages 2 + SyncBN, 2 worker(s)"} <= set(four)
    assert not any("hybrid" in n for n in one)
    assert all("--device" in cmd and "cuda" in cmd for name, cmd in gpu_steps(2, tmp_path)
               if name.startswith(("one rank", "SyncBN", "data", "hybrid", "fp16")))
    assert [name for name, _ in gpu_steps(1, tmp_path, benchmarks=False)] == one[:-1]
    assert [expected_error(name) for name in one].count(TOO_MANY) == 1


def test_the_refusal_gpu_check_expects_is_the_one_the_trainer_gives():
    """gpu-check runs one rank more than GPUs and passes only on this refusal: the text must be the product's."""
    from hvdtrain.errors import UserError
    from hvdtrain.models.pipeline import assign_devices

    with pytest.raises(UserError) as refused:
        assign_devices(1, 2, 1, visible=1)
    assert TOO_MANY in str(refused.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the GPU run below applies")
def test_gpu_check_without_cuda_is_one_line_nonzero_at_once():
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "hvdtrain", "doctor", "--gpu"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith("hvdtrain: error: no CUDA device") and time.monotonic() - start < 30


def test_make_gpu_check_is_doctor_gpu(tmp_path):
    proc = subprocess.run(["make", "-n", "gpu-check", f"VENV={tmp_path}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert f"{tmp_path}/bin/hvdtrain doctor --gpu" in proc.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA GPUs and a CUDA torch: runs every GPU "
                    "path (issue 32); no GPU has been available to this project yet")
def test_gpu_check_runs_every_gpu_path():
    proc = subprocess.run([sys.executable, "-m", "hvdtrain", "doctor", "--gpu"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
