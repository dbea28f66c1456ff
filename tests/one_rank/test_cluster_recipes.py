"""The cluster recipes work as written: the sbatch script runs, the MPIJobs are well-formed MPIJobs, the own-script
sbatch refuses a missing script in one line (it trains on a real Slurm cluster: tests/cluster/test_slurm_own_script.py),
and the non-root install loads the site's modules and finds its MPI."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.paths import BIN, ROOT
from support.processes import show

from hvdtrain.config.train_config import load_config

SBATCH = ROOT / "examples" / "cluster" / "slurm.sbatch"
MPIJOB = ROOT / "examples" / "cluster" / "mpijob.yaml"
OWN_SBATCH = ROOT / "examples" / "cluster" / "own_script.sbatch"
OWN_MPIJOB = ROOT / "examples" / "cluster" / "own_script_mpijob.yaml"
INSTALL = ROOT / "examples" / "cluster" / "install-nonroot.sh"


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
                                  "examples/cluster/mpijob.yaml", "examples/cluster/own_script_mpijob.yaml",
                                  "docker/README.md"])
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


def test_own_script_sbatch_asks_for_gpus_requeue_and_an_early_warning_and_wants_a_script(tmp_path):
    subprocess.run(["bash", "-n", str(OWN_SBATCH)], check=True, timeout=30)
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", OWN_SBATCH.read_text(), re.M))
    assert int(directives["nodes"]) == 2 and int(directives["ntasks-per-node"]) == 4      # 2 hosts x 4 GPUs
    assert directives["gpus-per-task"] == "1" and directives["signal"].startswith("B:USR1@")
    assert re.search(r"^#SBATCH --requeue$", OWN_SBATCH.read_text(), re.M)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run(["bash", str(OWN_SBATCH)], env={**env, "SLURM_SUBMIT_DIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2, show(proc)
    assert proc.stderr.strip() == ("hvdtrain: error: name your script after the recipe: "
                                   "sbatch examples/cluster/own_script.sbatch train.py")


def test_own_script_mpijob_gives_each_worker_a_gpu_and_runs_the_script_on_every_slot():
    job = yaml.safe_load(OWN_MPIJOB.read_text())
    assert job["apiVersion"] == "kubeflow.org/v2beta1" and job["kind"] == "MPIJob"
    replicas = job["spec"]["mpiReplicaSpecs"]
    slots = job["spec"]["slotsPerWorker"]
    worker = replicas["Worker"]["template"]["spec"]["containers"][0]
    assert worker["command"] == ["hvdtrain-sshd"]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == slots       # one worker per GPU
    launcher = replicas["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["image"] == worker["image"]                           # the user's image, on hvdtrain:gpu
    assert "FROM hvdtrain:gpu" in OWN_MPIJOB.read_text() and (ROOT / "docker" / "Dockerfile.gpu").exists()
    script = launcher_script(job).replace("\\\n", " ")
    horovodrun = re.search(r"horovodrun (.*?) python (\S+\.py) (.*)", script)
    assert horovodrun, script
    flags = shlex.split(horovodrun.group(1))
    assert int(flags[flags.index("-np") + 1]) == slots * replicas["Worker"]["replicas"]
    assert flags[flags.index("--hostfile") + 1] == "/etc/mpi/hostfile"
    load_config(None, shlex.split(horovodrun.group(3)))   # the script's own arguments are config keys
    # Credentials: only the file's path travels; every pod mounts the Secret at that path.
    path = {e["name"]: e["value"] for e in launcher["env"]}["HVDTRAIN_SECRETS_FILE"]
    for role in replicas.values():
        mounts = role["template"]["spec"]["containers"][0]["volumeMounts"]
        assert any(path.startswith(m["mountPath"] + "/") and m.get("readOnly") for m in mounts), role


def install(tmp_path: Path, path: str, **env: str) -> subprocess.CompletedProcess:
    """The non-root install as a user runs it, with a `module` command that only records what it loads (the site's
    Lmod or Environment Modules, found through MODULESHOME), and DRY_RUN: set-up prints what it would install."""
    init = tmp_path / "modules" / "init"
    init.mkdir(parents=True)
    (init / "bash").write_text(f'module() {{ echo "$*" >> {tmp_path / "loaded"}; }}\n')
    full = {k: v for k, v in os.environ.items() if k not in ("PIP_INDEX_URL", "TORCH_INDEX_URL", "HVDTRAIN_MODULES")}
    full.update(MODULESHOME=str(tmp_path / "modules"), DRY_RUN="1", TORCH_CPU_INDEX_URL="", PATH=path,
                VENV=str(tmp_path / "venv"), PYTHON=sys.executable)
    full.update(env)
    return subprocess.run(["bash", str(INSTALL)], cwd=tmp_path, env=full, capture_output=True, text=True, timeout=60)


def test_the_non_root_install_loads_the_modules_and_builds_against_the_mpi_found(tmp_path):
    proc = install(tmp_path, os.environ["PATH"], HVDTRAIN_MODULES="gcc/12 openmpi/4.1")
    assert proc.returncode == 0, show(proc)
    assert (tmp_path / "loaded").read_text() == "load gcc/12 openmpi/4.1\n"
    mpicxx = shutil.which("mpicxx")
    assert f"install-nonroot: MPI {mpicxx}, " in proc.stdout, show(proc)
    steps = [line for line in proc.stdout.splitlines() if line.startswith("+ ")]
    assert steps[-1] == f"+ PYTHON={tmp_path / 'venv'}/bin/python bash scripts/install-horovod", steps
    assert not (tmp_path / "venv").exists(), "a dry run created the venv"


def test_the_non_root_install_names_what_is_missing_in_one_line(tmp_path):
    bare = tmp_path / "bin"          # the tools the script itself needs, and no MPI or compiler
    bare.mkdir()
    for tool in ("bash", "dirname"):
        (bare / tool).symlink_to(shutil.which(tool))
    proc = install(tmp_path, str(bare), HVDTRAIN_MODULES="")
    assert proc.returncode == 2, show(proc)
    assert proc.stderr.strip() == ("install-nonroot: error: no mpicxx mpirun g++ on PATH; load the site's MPI and "
                                   "compiler modules (HVDTRAIN_MODULES)")
    proc = install(tmp_path / "again", str(bare), HVDTRAIN_MODULES="openmpi", MODULESHOME=str(tmp_path / "none"))
    assert proc.returncode == 2 and "no 'module' command here" in proc.stderr, show(proc)
