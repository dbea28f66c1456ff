"""The cluster recipes work as written: the sbatch script runs, the MPIJob is a well-formed MPIJob."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import BIN, ROOT, show

from hvdtrain.config.train_config import load_config

SBATCH = ROOT / "examples" / "cluster" / "slurm.sbatch"
MPIJOB = ROOT / "examples" / "cluster" / "mpijob.yaml"


def test_sbatch_script_is_valid_bash_and_asks_for_nodes_and_tasks():
    subprocess.run(["bash", "-n", str(SBATCH)], check=True, timeout=30)
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", SBATCH.read_text(), re.M))
    assert int(directives["nodes"]) >= 2 and int(directives["ntasks-per-node"]) >= 1


def run_sbatch(tmp_path: Path, slurm_env: dict[str, str], *args: str,
               launch: str = "horovodrun") -> subprocess.CompletedProcess:
    """The script's horovodrun-over-ssh variant as sbatch would run it, on a one-node 'allocation' of this
    machine (SLURM_* set by hand). Its default, srun, runs on a real Slurm cluster in tests/cluster/test_slurm.py."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_", "LSB_"))}
    env.update(slurm_env, SLURM_SUBMIT_DIR=str(ROOT), HVDTRAIN_VENV=str(BIN.parent), HVDTRAIN_IFACE="lo",
               TMPDIR=str(tmp_path), PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", HVDTRAIN_LAUNCH=launch)
    return subprocess.run(["bash", str(SBATCH), *args], env=env, capture_output=True, text=True, timeout=400)


def test_sbatch_script_refuses_an_unknown_launcher_in_one_line(tmp_path):
    proc = run_sbatch(tmp_path, {"SLURM_JOB_NODELIST": "localhost", "SLURM_TASKS_PER_NODE": "2"}, launch="mpiexec")
    assert proc.returncode == 2, show(proc)
    assert proc.stderr.strip() == ("hvdtrain: error: HVDTRAIN_LAUNCH='mpiexec' — use srun (the default) "
                                   "or horovodrun")


def test_sbatch_script_trains_on_the_allocation_it_is_given(tmp_path):
    proc = run_sbatch(tmp_path, {"SLURM_JOB_NODELIST": "localhost", "SLURM_TASKS_PER_NODE": "2"},
                      "--model", "mlp", "--epochs", "1", "--threads", "1", "--run-dir", str(tmp_path / "runs"),
                      "--name", "slurm")
    assert proc.returncode == 0, show(proc)
    assert "hvdtrain: slurm: 1 host, total slots 2" in proc.stderr
    summary = json.loads((tmp_path / "runs" / "slurm" / "summary.json").read_text())
    assert summary["workers"] == 2
    assert not list(tmp_path.glob("hvdtrain-hosts.*")), "the temporary hostfile was left behind"


def test_sbatch_script_stops_on_a_bad_allocation_before_launching(tmp_path):
    proc = run_sbatch(tmp_path, {"SLURM_JOB_NODELIST": "node[01-02]", "SLURM_TASKS_PER_NODE": "2(x3)"})
    assert proc.returncode == 2, show(proc)
    assert proc.stderr.strip() == ("hvdtrain: error: SLURM_TASKS_PER_NODE='2(x3)' gives 3 counts for the 2 "
                                   "nodes of SLURM_JOB_NODELIST='node[01-02]'")


def launcher_script(job: dict) -> str:
    container = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["/bin/bash", "-c"]
    return container["args"][0]


def hvdtrain_args(script: str) -> list[str]:
    """The words after `python -m hvdtrain` in the launcher's horovodrun line."""
    words = shlex.split(script.replace("\\\n", " "), comments=True)
    index = next(i for i in range(len(words) - 2) if words[i:i + 3] == ["python", "-m", "hvdtrain"])
    return words[index + 3:]


def test_mpijob_is_an_mpijob_that_runs_horovodrun_on_every_slot(tmp_path):
    job = yaml.safe_load(MPIJOB.read_text())
    assert job["apiVersion"] == "kubeflow.org/v2beta1" and job["kind"] == "MPIJob"
    assert job["metadata"]["name"]
    replicas = job["spec"]["mpiReplicaSpecs"]
    assert set(replicas) == {"Launcher", "Worker"}
    assert replicas["Launcher"]["replicas"] == 1
    for role in replicas.values():
        assert [c["image"] for c in role["template"]["spec"]["containers"]] == ["hvdtrain:cpu"]
    worker = replicas["Worker"]["template"]["spec"]["containers"][0]
    assert worker["command"] == ["hvdtrain-sshd"]     # docker/hvdtrain-sshd, in the image's PATH
    assert (ROOT / "docker" / "hvdtrain-sshd").exists()

    script = launcher_script(job)
    (tmp_path / "launcher.sh").write_text(script)
    subprocess.run(["bash", "-n", str(tmp_path / "launcher.sh")], check=True, timeout=30)
    horovodrun = re.search(r"horovodrun (.*?) python -m hvdtrain", script.replace("\\\n", " "), re.S)
    assert horovodrun, script
    flags = shlex.split(horovodrun.group(1))
    np = int(flags[flags.index("-np") + 1])
    assert np == job["spec"]["slotsPerWorker"] * replicas["Worker"]["replicas"]
    assert flags[flags.index("--hostfile") + 1] == "/etc/mpi/hostfile"  # where the operator writes it
    load_config(None, hvdtrain_args(script))  # the trainer accepts the arguments (raises otherwise)


def horovodrun_flags() -> set[str]:
    help_text = subprocess.run([str(BIN / "horovodrun"), "--help"], capture_output=True, text=True,
                               timeout=120).stdout
    return set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", help_text))


@pytest.mark.parametrize("path", ["README.md", "hostfiles/README.md", "examples/cluster/slurm.sbatch",
                                  "examples/cluster/mpijob.yaml", "docker/README.md"])
def test_documented_horovodrun_commands_use_real_flags(path):
    """Every flag given to horovodrun in the docs and recipes is one horovodrun 0.28.1 knows."""
    text = (ROOT / path).read_text().replace("\\\n", " ")
    # `hvdtrain launch` is horovodrun plus its own two options, which it takes before horovodrun's.
    known = horovodrun_flags() | {"--secrets-dir", "--grace-s"}
    launcher = r"(?:horovodrun|hvdtrain\"? launch)"
    lines = [line for line in text.splitlines() if re.search(launcher + r"\"? -", line)]
    assert lines, f"no horovodrun (or hvdtrain launch) command in {path}"
    for line in lines:
        before_program = re.split(r"\s(?:\S*python\S*|train\.py)\s", line)[0]
        after = re.split(launcher, before_program, maxsplit=1)[1]
        used = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", after))
        assert used <= known, f"{path}: unknown horovodrun flags {used - known} in: {line.strip()}"
