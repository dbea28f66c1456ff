"""Issue 32 item 6: only the torch install uses a CUDA index; the extras and Horovod stay on the user's
index. Checked by the set-up script's dry run (it prints its commands and changes nothing)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CU128 = "https://download.pytorch.org/whl/cu128"


def setup_env(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("PIP_INDEX_URL", "TORCH_INDEX_URL")}
    full.update(VENV=str(tmp_path / "venv"), PYTHON=sys.executable, DRY_RUN="1", **env)
    return subprocess.run(["bash", str(ROOT / "scripts/setup-env")], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=60)


def commands(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stdout.splitlines() if line.startswith("+ ")]


def test_torch_index_applies_to_the_torch_install_only(tmp_path):
    proc = setup_env(tmp_path, TORCH_INDEX_URL=CU128)
    assert proc.returncode == 0, proc.stderr
    torch, extras, horovod = commands(proc)
    assert torch.endswith(f"install --index-url {CU128} torch==2.13.0")
    assert "install -e .[" in extras and "--index-url" not in extras
    assert "install-horovod" in horovod and "--index-url" not in horovod
    assert not (tmp_path / "venv").exists(), "a dry run created the venv"


def test_without_torch_index_no_index_is_named(tmp_path):
    proc = setup_env(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert commands(proc)[0].endswith("install torch==2.13.0")
    assert not any("--index-url" in line for line in commands(proc))


def test_a_pytorch_pip_index_url_is_refused_with_the_variable_to_use(tmp_path):
    proc = setup_env(tmp_path, PIP_INDEX_URL=CU128)
    assert proc.returncode == 1 and not commands(proc)
    assert proc.stderr.strip().splitlines()[-1] == (
        f"setup-env: error: PIP_INDEX_URL={CU128} would replace the package index for every pip call "
        f"(the extras and Horovod are not there); set TORCH_INDEX_URL={CU128} instead")


def test_make_setup_hands_torch_index_url_to_the_script(tmp_path):
    proc = subprocess.run(["make", "-n", "-B", "setup", f"VENV={tmp_path / 'venv'}", f"TORCH_INDEX_URL={CU128}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f"TORCH_INDEX_URL='{CU128}'" in proc.stdout and "scripts/setup-env" in proc.stdout
