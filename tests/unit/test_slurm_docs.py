"""Every Slurm command docs/slurm.md shows is one the Slurm tests run: each sbatch/srun/scancel/scontrol line
in its bash blocks names only flags, subcommands and variables that tests/cluster/test_slurm*.py or the recipe
they submit (examples/cluster/slurm.sbatch) use. The trainer's own flags after the script or `-m hvdtrain` are
tests/unit/test_docs.py's to check. (Issue 39.)"""
from __future__ import annotations

import re
import shlex

import pytest
from support.paths import ROOT

PAGE = ROOT / "docs" / "slurm.md"
RUN_BY = [ROOT / "tests" / "cluster" / "test_slurm.py", ROOT / "tests" / "cluster" / "test_slurm_hosts.py",
          ROOT / "tests" / "cluster" / "test_slurm_tune.py", ROOT / "examples" / "cluster" / "slurm.sbatch",
          ROOT / "examples" / "cluster" / "tune.sbatch"]
SLURM = ("sbatch", "srun", "scancel", "scontrol")
BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)


def commands(text: str) -> list[str]:
    """The Slurm command lines of the page's bash blocks (comments and #SBATCH lines left out)."""
    lines = [line.split("  #")[0].strip() for block in BLOCK.findall(text) for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")
            and any(word in SLURM for word in shlex.split(line)[:3])]


def unused(line: str, haystack: str) -> list[str]:
    """What a command line names that the tests never use: flags and words up to the trainer's arguments."""
    missing = []
    for word in shlex.split(line):
        if word.endswith(("slurm.sbatch", "tune.sbatch", "/python")):
            break                                   # the rest goes to the trainer
        if word in ("export", "JOBID") or word.startswith(".venv/"):
            continue
        name = word.split("=")[0] if "=" in word and not word.startswith("-") else word
        if name not in haystack:
            missing.append(name)
    return missing


def test_every_slurm_command_on_the_page_is_run_by_the_tests() -> None:
    haystack = "\n".join(path.read_text() for path in RUN_BY)
    found = commands(PAGE.read_text())
    assert len(found) >= 8, found
    problems = {line: unused(line, haystack) for line in found if unused(line, haystack)}
    assert not problems, f"docs/slurm.md shows what no Slurm test runs: {problems}"


@pytest.mark.parametrize("line, missing", [
    ("scancel --signal=HUP JOBID", ["--signal=HUP"]),
    ("sbatch --exclusive examples/cluster/slurm.sbatch --epochs 5", ["--exclusive"]),
    ("scontrol reboot JOBID", ["reboot"]),
])
def test_a_command_no_test_runs_is_reported(line: str, missing: list[str]) -> None:
    haystack = "\n".join(path.read_text() for path in RUN_BY)
    assert unused(line, haystack) == missing
