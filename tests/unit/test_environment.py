"""environment.process: which rank am I, and who started me, from each launcher's variables."""
from __future__ import annotations

import ast

import pytest
from support.paths import ROOT

from hvdtrain.environment import process
from hvdtrain.environment.process import LAUNCHERS, Process, from_env


@pytest.mark.parametrize("env, expected", [
    ({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2"},
     Process(1, 4, 1, 2, "gloo")),
    # horovodrun --mpi: Open MPI's variables only (the case compress once got wrong: every rank wrote)
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, Process(1, 2, 1, 2, "openmpi")),
    ({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}, Process(3, 4, 1, 2, "mpich")),
    ({"PMIX_RANK": "2", "PMIX_SIZE": "4"}, Process(2, 4, 2, 4, "pmix")),
    ({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2(x2)"},
     Process(3, 4, 1, 2, "slurm")),                                 # "2(x2)" is no number: local rank + 1
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}, Process(0, 2, 0, 2, "torchrun")),
    # mpirun inside a Slurm allocation: the ranks are Open MPI's, not the batch step's
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"},
     Process(1, 2, 1, 2, "openmpi")),
])
def test_each_launchers_variables_give_rank_size_and_local_layout(env, expected):
    assert from_env(env) == expected


# A bare PMIX_RANK is what a singleton MPI_Init leaves in its children's environment, not a launcher.
@pytest.mark.parametrize("env", [{}, {"HOROVOD_RANK": ""}, {"OMPI_COMM_WORLD_RANK": "x"}, {"PATH": "/bin"},
                                 {"PMIX_RANK": "0"}])
def test_no_launcher_is_none_and_the_process_is_alone(env):
    assert from_env(env) is None
    assert not process.launched(env)


def test_horovods_own_answer_wins_once_registered(monkeypatch):
    monkeypatch.setattr(process, "_HOROVOD", [lambda: Process(5, 8, 1, 4, "horovod")])
    assert process.current({"OMPI_COMM_WORLD_RANK": "0"}) == Process(5, 8, 1, 4, "horovod")
    assert not process.is_rank_zero()
    monkeypatch.setattr(process, "_HOROVOD", [lambda: None])        # registered, not initialised yet
    assert process.current({"OMPI_COMM_WORLD_RANK": "1"}).rank == 1
    assert process.current({}) == process.ALONE


def test_no_other_module_reads_rank_variables():
    """One source: a rank variable's name as a string anywhere else in hvdtrain is a second answer that can
    disagree (as compress's HOROVOD_RANK did under horovodrun --mpi). Docstrings may mention them."""
    names = {var for launcher in LAUNCHERS for var in launcher[1:]}
    allowed = {"hvdtrain/environment/process.py",
               "hvdtrain/cluster/allocations.py"}   # parses allocations (host lists), not this process's rank
    found = [f"{p.relative_to(ROOT)}:{node.lineno} {node.value}" for p in (ROOT / "hvdtrain").rglob("*.py")
             if str(p.relative_to(ROOT)) not in allowed
             for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, ast.Constant) and node.value in names]
    assert not found, found


def test_rank_variables_exported_by_a_parent_process_do_not_make_a_child_launched():
    """A test runner or notebook that ran Horovod in-process exported RANK=0; its subprocesses are alone."""
    env: dict[str, str] = {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}
    assert process.export_rank_env(env) == Process(0, 2, 0, 2, "gloo")
    assert env["RANK"] == "0" and env["WORLD_SIZE"] == "2"
    child = {key: value for key, value in env.items() if not key.startswith("HOROVOD_")}
    assert from_env(child) is not None                       # this process exported them: still itself
    assert from_env(child, pid=1) is None                    # a child that inherited them: no launcher
    assert from_env({"RANK": "1", "WORLD_SIZE": "2"}, pid=1) == Process(1, 2, 1, 2, "torchrun")  # torchrun's own
    # torchrun started by that parent sets them anew for its workers, under the inherited marker
    relaunched = {**child, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert from_env(relaunched, pid=1) == Process(1, 2, 1, 2, "torchrun")


def test_rank_variables_a_launcher_set_are_never_overwritten():
    """torchrun's workers under a parent whose MPI singleton left PMIX/OMPI traces: RANK/WORLD_SIZE stay theirs."""
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1", "RANK": "1", "WORLD_SIZE": "2",
           "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert process.export_rank_env(env) is None and env["RANK"] == "1" and env["WORLD_SIZE"] == "2"


def test_a_run_gives_back_what_it_set_unless_changed_since():
    """environment/caller.py: two runs open at once (two Trainers in a notebook), closed in either order."""
    import doctest

    from hvdtrain.environment import caller

    result = doctest.testmod(caller)
    assert result.attempted and not result.failed
    for first_closed in ("a", "b"):
        env = {"HOME": "/root"}
        before_a = dict(env)
        env.update(RANK="0", HOROVOD_CYCLE_TIME="2")
        started_a = dict(env)
        before_b, started_b = dict(env), dict(env)        # b set nothing new: a's values are there
        closing = [(before_a, started_a), (before_b, started_b)]
        for before, started in closing if first_closed == "a" else closing[::-1]:
            caller.give_back(env, before, started)
        assert env == {"HOME": "/root"}
    env = {"HOME": "/root", "RANK": "5"}                  # the user set RANK during the run: theirs now
    assert caller.give_back(env, {"HOME": "/root"}, {"HOME": "/root", "RANK": "0"}) == []
    assert env == {"HOME": "/root", "RANK": "5"}
