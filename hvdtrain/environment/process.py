"""Which rank am I, and who started me: the one place that answers (Lightning Fabric's
`plugins/environments` idea, one table instead of one class per launcher).

Once Horovod is initialised its own answer wins (`distributed` registers it; this module never imports
Horovod). Before that, or in a process Horovod never starts (the CLI before training, a compression
job's driver, an error report), the launcher's variables answer. Nothing else in hvdtrain reads
rank-like variables.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass

# Set by launchers that know where each worker's own GPUs start in its CUDA_VISIBLE_DEVICES (hvdtrain.ray);
# train/device.py reads it.
FIRST_GPU_ENV = "HVDTRAIN_FIRST_GPU"


@dataclass(frozen=True)
class Process:
    rank: int
    size: int
    local_rank: int
    local_size: int
    launcher: str    # "horovod" (initialised), "gloo", "openmpi", "mpich", "pmix", "slurm", "torchrun", "none"

    @property
    def is_root(self) -> bool:
        return self.rank == 0


# (launcher, rank, size, local rank, local size) variables, most specific first: mpirun inside a Slurm
# allocation sets both OMPI_* and SLURM_*, and its ranks are Open MPI's. horovodrun --gloo, Horovod
# elastic and horovod.spark.run (Gloo) set HOROVOD_*; horovodrun --mpi sets only Open MPI's. MPICH's and
# Intel MPI's Hydra set PMI_*; PMIx launchers (prun, srun --mpi=pmix) PMIX_RANK without a size variable.
LAUNCHERS: tuple[tuple[str, str, str, str, str], ...] = (
    ("gloo", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("pmix", "PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK", "PMIX_LOCAL_SIZE"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
)
ALONE = Process(0, 1, 0, 1, "none")

# The variables torch.distributed's launchers set, which webdataset's split_by_node, mosaicml-streaming and
# Hugging Face's own helpers read to pick a rank's shards. horovodrun and mpirun set none of them, so
# without these every rank would silently read every sample.
TORCH_STYLE = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
EXPORT_ENV = "HVDTRAIN_EXPORT_RANK_ENV"     # "0": leave them alone
EXPORTED_BY_ENV = "HVDTRAIN_RANK_ENV_BY"    # "PID:values": who exported them, and what (see from_env)

# Horovod's own answer, registered by `distributed` (at most one entry).
_HOROVOD: list[Callable[[], Process | None]] = []


def _number(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name, "").strip()
    # SLURM_NTASKS_PER_NODE may read "2(x3)"; anything that is not a plain number is unknown, not an error.
    return int(text) if text.isdigit() else default


def from_env(env: Mapping[str, str], pid: int | None = None) -> Process | None:
    """The launcher's answer from environment `env` (of process `pid`, default this one), or None when no
    launcher started it.

    Example:
        >>> from_env({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"})
        Process(rank=1, size=2, local_rank=1, local_size=2, launcher='openmpi')
    """
    # RANK & co. exactly as hvdtrain exported them in a parent process (a test runner, a notebook kernel)
    # say nothing about a child no launcher started; a launcher that set them anew (torchrun) is believed.
    exported_pid, _, exported = env.get(EXPORTED_BY_ENV, "").partition(":")
    inherited = bool(exported_pid) and exported_pid != str(os.getpid() if pid is None else pid) and \
        exported == ",".join(env.get(name, "") for name in TORCH_STYLE)
    for launcher, rank_var, size_var, local_rank_var, local_size_var in LAUNCHERS:
        if not env.get(rank_var, "").strip().isdigit() or (launcher == "torchrun" and inherited):
            continue
        if launcher == "pmix" and size_var not in env:
            continue    # a bare PMIX_RANK=0 is what a singleton MPI_Init (hvd.init alone) leaves to its children
        rank = int(env[rank_var])
        size = max(_number(env, size_var, rank + 1), rank + 1)
        # Without local variables, assume one host (horovodrun -np N on a laptop); with a local rank only,
        # at least that many on this host.
        local_rank = _number(env, local_rank_var, rank)
        local_size = _number(env, local_size_var, size if local_rank_var not in env else local_rank + 1)
        return Process(rank, size, local_rank, local_size, launcher)
    return None


def launcher_env(place: Process, launcher: str = "gloo") -> dict[str, str]:
    """The variables `launcher` gives a process at `place`: for launchers of hvdtrain's own (Ray actors get
    what horovodrun --gloo sets), written from the same table this module reads them with."""
    names = next(row[1:] for row in LAUNCHERS if row[0] == launcher)
    return dict(zip(names, map(str, (place.rank, place.size, place.local_rank, place.local_size)), strict=True))


def elastic_slot(env: Mapping[str, str] | None = None) -> tuple[str, int] | None:
    """This worker's slot as horovodrun --gloo names it (host name, local rank): the key Horovod's elastic
    driver files its workers under. None under other launchers.

    Example:
        >>> elastic_slot({"HOROVOD_RANK": "3", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_HOSTNAME": "node2"})
        ('node2', 1)
    """
    env = os.environ if env is None else env
    started = from_env(env)
    host = env.get("HOROVOD_HOSTNAME", "")
    return (host, started.local_rank) if started is not None and started.launcher == "gloo" and host else None


def use_horovod(answer: Callable[[], Process | None]) -> None:
    """Called by `distributed` at import: `answer()` is Horovod's own view, or None before hvd.init()."""
    _HOROVOD[:] = [answer]


def current(env: Mapping[str, str] | None = None) -> Process:
    """This process now: Horovod's rank once initialised (it changes after an elastic reset), else the launcher's."""
    for answer in _HOROVOD:
        known = answer()
        if known is not None:
            return known
    return from_env(os.environ if env is None else env) or ALONE


def is_rank_zero() -> bool:
    """The one test for "rank 0 does side effects" outside the training loop (CLI notices, reports)."""
    return current().is_root


def launched(env: Mapping[str, str] | None = None) -> bool:
    """A launcher started this process (its output goes to the launcher, not to a terminal of the user's)."""
    return from_env(os.environ if env is None else env) is not None


def export_rank_env(env: MutableMapping[str, str] | None = None) -> Process | None:
    """Set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE in `env` (default os.environ) to this process's
    place in the job, when a launcher started it (or Horovod runs). Returns what was exported, or None."""
    env = os.environ if env is None else env
    if env.get(EXPORT_ENV) == "0":
        return None
    me = current(env)
    # torchrun set them already; Slurm's batch step looks like rank 0 of the whole allocation, so srun'd
    # workers are left to srun (and to hvd.init, which exports Horovod's own answer).
    if me is ALONE or me.launcher in ("torchrun", "slurm"):
        return None
    ours = env.get(EXPORTED_BY_ENV, "").partition(":")[2] == ",".join(env.get(name, "") for name in TORCH_STYLE)
    if any(name in env for name in TORCH_STYLE) and not ours:
        return None     # set by a launcher of their own (torchrun under an MPI singleton's child): theirs win
    env.update(zip(TORCH_STYLE, map(str, (me.rank, me.size, me.local_rank, me.local_size)), strict=True))
    env[EXPORTED_BY_ENV] = f"{os.getpid()}:" + ",".join(env[name] for name in TORCH_STYLE)
    return me
