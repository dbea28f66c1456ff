"""Horovod over Gloo for tasks `srun` starts itself, with no MPI and no horovodrun: what horovodrun --gloo
would give each worker (horovod/runner/gloo_run.py), computed from the SLURM_* variables of a job step.

srun sets every task's place (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_TASKS_PER_NODE,
SLURM_STEP_NODELIST); Horovod's Gloo controller needs the same facts under its own names plus a rendezvous
server every task can reach. Rank 0 serves it (train/slurm_gloo_join.py) on the step's first node, at a port
every task derives from the job and step ids alone, so no task has to talk to another first. Pure functions
of the environment, tested without Slurm.

Applies where srun started a step of more than one task and no MPI or launcher of Horovod's did
(`srun --mpi=none`, or a site whose MpiDefault is none): PMIX_RANK/PMI_RANK (srun --mpi=pmix/pmi2),
OMPI_COMM_WORLD_RANK (mpirun) or HOROVOD_RANK (horovodrun) mean someone else set the world up.
HVDTRAIN_SLURM_GLOO=0 turns it off; HVDTRAIN_GLOO_PORT picks the port; HVDTRAIN_IFACE the interface.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hvdtrain.cluster.allocations import expand_hostlist, expand_task_counts
from hvdtrain.environment.process import LAUNCHERS, Process, from_env, launcher_env
from hvdtrain.errors import HostsError

# The rank variables of every launcher but srun's own (environment/process.py's table), and a Gloo rendezvous.
OTHER_LAUNCHERS = (*(row[1] for row in LAUNCHERS if row[0] not in ("slurm", "torchrun")),
                   "HOROVOD_GLOO_RENDEZVOUS_ADDR")
# Step ids at and above this are Slurm's own steps (batch script, extern, interactive), not an srun's.
FIRST_SPECIAL_STEP = 0xFFFFFFF0
PORT_BASE, PORT_SPAN = 20000, 30000     # below Linux's ephemeral range (32768+ collide less above 50000)


@dataclass(frozen=True)
class Slot:
    """One task's place, with the fields of Horovod's SlotInfo."""
    hostname: str
    rank: int
    local_rank: int
    cross_rank: int
    size: int
    local_size: int
    cross_size: int


def _int(env: Mapping[str, str], name: str) -> int:
    text = env.get(name, "").strip()
    if not text.isdigit():
        raise HostsError(f"{name}={text!r} is not a number: run this inside an srun job step, or set "
                         "HVDTRAIN_SLURM_GLOO=0")
    return int(text)


def applies(env: Mapping[str, str]) -> bool:
    """Whether this process is a task of an srun step of several tasks that nothing else set Horovod up for.

    Example:
        >>> applies({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1"})
        True
        >>> applies({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1", "PMIX_RANK": "1"})
        False
    """
    if env.get("HVDTRAIN_SLURM_GLOO", "").strip() == "0" or any(name in env for name in OTHER_LAUNCHERS):
        return False
    step, tasks = env.get("SLURM_STEP_ID", "").strip(), env.get("SLURM_STEP_NUM_TASKS", "").strip()
    here = from_env(env)
    return (step.isdigit() and int(step) < FIRST_SPECIAL_STEP and tasks.isdigit() and int(tasks) > 1
            and here is not None and here.launcher == "slurm")


def slots(nodes: list[str], tasks_per_node: list[int]) -> list[Slot]:
    """Every task's place under srun's default (block) distribution: a node's tasks have consecutive ranks.

    Example:
        >>> [(s.hostname, s.rank, s.local_rank, s.cross_rank, s.cross_size) for s in slots(["a", "b"], [2, 1])]
        [('a', 0, 0, 0, 2), ('a', 1, 1, 0, 1), ('b', 2, 0, 1, 2)]
    """
    if len(nodes) != len(tasks_per_node):
        raise HostsError(f"{len(nodes)} node(s) ({','.join(nodes)}) but {len(tasks_per_node)} task count(s) "
                         f"({tasks_per_node}): SLURM_STEP_NODELIST and SLURM_STEP_TASKS_PER_NODE disagree")
    size = sum(tasks_per_node)
    found, rank = [], 0
    for node, (name, count) in enumerate(zip(nodes, tasks_per_node, strict=True)):
        for local_rank in range(count):
            # Horovod's cross communicator joins the tasks with the same local rank, one per node.
            cross_rank = sum(1 for n in tasks_per_node[:node] if n > local_rank)
            cross_size = sum(1 for n in tasks_per_node if n > local_rank)
            found.append(Slot(name, rank, local_rank, cross_rank, size, count, cross_size))
            rank += 1
    return found


def rendezvous_port(env: Mapping[str, str]) -> int:
    """HVDTRAIN_GLOO_PORT, else one port from the job and step ids: the same in every task of the step, and in a
    requeued run of the job (its old server is gone by then).

    Example:
        >>> rendezvous_port({"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "1"})
        20673
        >>> rendezvous_port({"HVDTRAIN_GLOO_PORT": "7000"})
        7000
    """
    if env.get("HVDTRAIN_GLOO_PORT", "").strip():
        port = _int(env, "HVDTRAIN_GLOO_PORT")
        if not 0 < port < 65536:
            raise HostsError(f"HVDTRAIN_GLOO_PORT={port} is not a TCP port: use 1-65535")
        return port
    return PORT_BASE + (_int(env, "SLURM_JOB_ID") * 16 + _int(env, "SLURM_STEP_ID")) % PORT_SPAN


def gloo_env(env: Mapping[str, str]) -> tuple[dict[str, str], list[Slot]]:
    """The Horovod variables of this task (rendezvous address: the step's first node by name, for the caller to
    resolve), and every task's slot (for rank 0's rendezvous server). ({}, []) where applies() is False.

    Example:
        >>> env = {"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "3", "SLURM_PROCID": "2", "SLURM_LOCALID": "0",
        ...        "SLURM_NODEID": "1", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "2,1",
        ...        "SLURM_JOB_ID": "9", "SLURMD_NODENAME": "n2"}
        >>> found = gloo_env(env)[0]
        >>> found["HOROVOD_RANK"], found["HOROVOD_CROSS_RANK"], found["HOROVOD_GLOO_RENDEZVOUS_ADDR"]
        ('2', '1', 'n1')
    """
    if not applies(env):
        return {}, []
    nodes = expand_hostlist(env.get("SLURM_STEP_NODELIST", "").strip() or env.get("SLURM_JOB_NODELIST", ""))
    everyone = slots(nodes, expand_task_counts(env.get("SLURM_STEP_TASKS_PER_NODE", ""),
                                               "SLURM_STEP_TASKS_PER_NODE"))
    here = from_env(env)
    assert here is not None     # applies() said so
    rank, local_rank, node = here.rank, here.local_rank, _int(env, "SLURM_NODEID")
    if len(everyone) != _int(env, "SLURM_STEP_NUM_TASKS") or rank >= len(everyone) or node >= len(nodes):
        raise HostsError(f"task rank {rank} (srun's), SLURM_NODEID={node}, SLURM_STEP_NUM_TASKS="
                         f"{env.get('SLURM_STEP_NUM_TASKS')} do not fit SLURM_STEP_TASKS_PER_NODE="
                         f"{env.get('SLURM_STEP_TASKS_PER_NODE')!r}")
    tasks_here = sum(1 for slot in everyone if slot.hostname == nodes[node])
    counts = [sum(1 for slot in everyone if slot.hostname == name) for name in nodes]
    # The task's own local rank and node, as srun placed it (a --distribution other than block still fits).
    place = Process(rank, len(everyone), local_rank, tasks_here, "gloo")
    found = {**launcher_env(place, "gloo"),
             "HOROVOD_HOSTNAME": env.get("SLURMD_NODENAME", "").strip() or nodes[node],
             "HOROVOD_CROSS_RANK": str(sum(1 for n in counts[:node] if n > local_rank)),
             "HOROVOD_CROSS_SIZE": str(sum(1 for n in counts if n > local_rank)),
             "HOROVOD_GLOO_RENDEZVOUS_ADDR": nodes[0], "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous_port(env)),
             "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"}
    iface = env.get("HVDTRAIN_IFACE", "").strip()
    if iface:
        found.update(HOROVOD_GLOO_IFACE=iface, NCCL_SOCKET_IFNAME=iface)
    return found, everyone
