"""Issue 32 item 6: only the torch install uses a CUDA index; the extras and Horovod stay on the user's
index. Checked by the set-up script's dry run (it prints its commands and changes nothing)."""
from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import choose_torch as ct
import pytest

ROOT = Path(__file__).resolve().parents[2]
CU128 = "https://download.pytorch.org/whl/cu128"


def setup_env(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("PIP_INDEX_URL", "TORCH_INDEX_URL")}
    # '' = never ask PyTorch's CPU index (the tests that want one pass a loopback index of their own).
    full.update(VENV=str(tmp_path / "venv"), PYTHON=sys.executable, DRY_RUN="1", TORCH_CPU_INDEX_URL="")
    full.update(env)
    return subprocess.run(["bash", str(ROOT / "scripts/setup-env")], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=60)


def commands(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stdout.splitlines() if line.startswith("+ ")]


def test_torch_index_applies_to_the_torch_install_only(tmp_path):
    proc = setup_env(tmp_path, TORCH_INDEX_URL=CU128)
    assert proc.returncode == 0, proc.stderr
    torch, extras, s3_server, horovod = commands(proc)
    assert torch.endswith(f"install --index-url {CU128} torch==2.13.0")
    assert "install -e .[" in extras and "--index-url" not in extras
    # The tests' S3 server goes in a virtualenv of its own, whose pins never meet the project's.
    server_python = tmp_path / "venv" / "moto-server" / "bin" / "python"
    assert s3_server == f"+ {server_python} -m pip --disable-pip-version-check -q install moto[server]==5.2.5"
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


# Issue 37: a machine without a GPU gets the CPU build where PyTorch's CPU index answers, PyPI's otherwise.


@pytest.fixture
def cpu_index():
    """A real HTTP index on loopback that answers for /torch/, as download.pytorch.org/whl/cpu does."""
    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(200 if self.path == "/whl/cpu/torch/" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
    server.shutdown()
    server.server_close()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/whl/cpu"


def test_no_gpu_and_a_reachable_cpu_index_installs_the_cpu_build_from_it(tmp_path, cpu_index):
    proc = setup_env(tmp_path, TORCH_CPU_INDEX_URL=cpu_index)
    assert proc.returncode == 0, proc.stderr
    assert commands(proc)[0].endswith(f"install --index-url {cpu_index} torch==2.13.0")
    assert f"setup-env: installing torch==2.13.0, the CPU build from {cpu_index} (no NVIDIA GPU" in proc.stdout


def test_an_unreachable_cpu_index_falls_back_to_the_default_index_in_one_line(tmp_path):
    url = closed_port_url()
    proc = setup_env(tmp_path, TORCH_CPU_INDEX_URL=url)
    assert proc.returncode == 0, proc.stderr
    assert commands(proc)[0].endswith("install torch==2.13.0")
    said = [line for line in proc.stdout.splitlines() if line.startswith("setup-env: installing torch")]
    assert said == [f"setup-env: installing torch==2.13.0 from the default index: no NVIDIA GPU, but {url} cannot "
                    "be reached (on Linux x86_64 PyPI's torch is a CUDA build of several GB; Horovod is then built "
                    "for CPU)"]


@pytest.mark.parametrize(("index", "gpu", "reachable", "installed", "expected"), [
    ("", False, True, None, (ct.CPU_INDEX_URL, False)),
    ("", False, False, None, ("", False)),
    ("", False, False, "cuda", ("", False)),             # nothing better to switch to
    ("", True, False, "cpu", ("", True)),                # a GPU appeared: CPU torch replaced by PyPI's CUDA one
    ("", False, True, "cuda", (ct.CPU_INDEX_URL, True)),  # pip alone would call the CUDA torch "satisfied"
    (CU128, False, True, "cpu", (CU128, True)),           # the user's index wins, build switched
    (CU128, False, True, "cuda", (CU128, False)),
    ("https://mirror.example/simple", False, True, "cpu", ("https://mirror.example/simple", False)),
])
def test_torch_choice(index, gpu, reachable, installed, expected):
    choice = ct.choose("torch==2.13.0", index, gpu, ct.CPU_INDEX_URL, reachable, installed)
    assert (choice.index_url, choice.remove_first) == expected
    assert "\n" not in choice.message


def test_the_setup_stamp_changes_with_the_torch_build_asked_for(tmp_path):
    def stamp(**variables: str) -> str:
        proc = subprocess.run(["make", "-n", "-B", "setup", f"VENV={tmp_path / 'venv'}",
                               *(f"{k}={v}" for k, v in variables.items())],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split("STAMP='", 1)[1].split("'", 1)[0]

    stamps = {stamp(), stamp(TORCH_INDEX_URL=CU128), stamp(TORCH_SPEC="torch==2.14.1"), stamp(EXTRAS="dev")}
    assert len(stamps) == 4 and stamp() in stamps


def test_installed_build_reads_the_venv_torch_through_install_horovods_probe(tmp_path):
    import torch

    assert ct.installed_build(sys.executable) == ("cuda" if torch.version.cuda else "cpu")
    assert ct.installed_build(str(tmp_path / "no-venv" / "bin" / "python")) is None
    # A Python without torch (a venv being created): no build to replace.
    bare = tmp_path / "bare-python"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    bare.chmod(0o755)
    assert ct.installed_build(str(bare)) is None
