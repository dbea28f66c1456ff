"""The one module that imports horovod.torch; the rest of `distributed` takes `hvd` from here.

Horovod's start, who we are, and how the ranks talk. The package is split by concern, as Horovod's own
`horovod/torch` is: settings (what hvd.init reads), collectives, gradients (DistributedOptimizer),
wait, wire (bfloat16 on the wire), sync_bn, elastic_state.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hvdtrain.distributed.horovod_settings import gloo_defaults, idle_defaults, mpi_defaults, timeout_defaults
from hvdtrain.environment import caller, process
from hvdtrain.errors import UserError

try:
    import horovod.torch as hvd
except ImportError as _err:  # doctor explains; the trainer cannot run without it
    hvd = None
    IMPORT_ERROR: Exception | None = _err
else:
    IMPORT_ERROR = None


# The binding hvdtrain's bfloat16 patch adds; a Horovod built without it (an old cached wheel) lacks it.
BF16_BINDING = "horovod_torch_allreduce_async_torch_BFloat16Tensor"

# Who we are: the same record the rest of hvdtrain gets from environment.process, Horovod's answer.
World = process.Process

# This process's one start of Horovod by init(): the HOROVOD_* values hvd.init() read (a later init's settings are
# compared with them, not with os.environ, which a finished run gave back), and the variables init() set for it
# (set again for each later run: an elastic reset's hvd.init() reads them during the run).
_READ_AT_START: dict[str, str] = {}
_SET_FOR_START: dict[str, str] = {}


def require() -> Any:
    if hvd is None:
        raise UserError(f"Horovod is not usable here ({IMPORT_ERROR}); run `make setup` "
                        "or scripts/install-horovod, then `hvdtrain doctor`")
    return hvd


def init(settings: dict[str, str] | None = None) -> World:
    """Start Horovod (idempotent) with `settings` (see horovod_env) and say who we are. The variables set for it
    stay in os.environ (a worker process's own); an in-process run uses `started`, which gives them back."""
    h = require()
    settings = settings or {}
    if h.is_initialized():
        read = _READ_AT_START or os.environ   # os.environ: Horovod was started by a plain hvd.init()
        late = [key for key, value in settings.items() if read.get(key) != value]
        if late:
            raise UserError(f"Horovod is already running in this process, so {', '.join(late)} cannot take "
                            "effect (read once at start); use a new process or notebook kernel")
        os.environ.update(_SET_FOR_START)
    else:
        before = dict(os.environ)
        # CUDA's default numbering (fastest first) differs from NVML's, Slurm's and nvidia-smi's (PCI bus order):
        # one order everywhere, unless the user chose one or CUDA is already running (then it is too late).
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        os.environ.update(mpi_defaults(os.environ))  # Open MPI reads these in MPI_Init, inside h.init()
        os.environ.update(settings)  # Horovod's core reads these once, inside init()
        os.environ.update(gloo_defaults(os.environ))  # after the config's settings: autotune wins
        os.environ.update(idle_defaults(os.environ))
        os.environ.update(timeout_defaults(os.environ))  # after them too: the config's or horovodrun's wins
        _READ_AT_START.clear()
        _READ_AT_START.update((key, value) for key, value in os.environ.items() if key.startswith("HOROVOD_"))
        _SET_FOR_START.clear()
        _SET_FOR_START.update((key, value) for key, value in os.environ.items() if before.get(key) != value)
    h.init()
    process.export_rank_env()   # Horovod's answer, for libraries that shard by RANK/WORLD_SIZE
    return world()


@contextmanager
def started(settings: dict[str, str] | None = None) -> Iterator[World]:
    """`init(settings)` for the duration of an in-process run (hvdtrain.fit, Trainer.fit, an inprocess study):
    when the block ends, normally or by an error, the variables set in os.environ for it are given back to the
    caller, removed or with their old value (environment/caller.py). Nested blocks give back only their own.

    Horovod itself stays initialised after the run, by design: MPI cannot start again in a process after
    MPI_Finalize, so a notebook's next run reuses it. Giving its variables back is still safe: hvd.init() and
    MPI_Init read HOROVOD_* and OMPI_MCA_* at start (an elastic reset's hvd.init() reads them again, during a run:
    init() sets them again for every run), later settings are compared with the values read then, and CUDA reads
    CUDA_DEVICE_ORDER once, when it starts. RANK & co. are for data libraries, during a run. What MPI_Init itself
    sets at C level (PMIX_*) never was in os.environ and stays.

    Example:
        >>> with runtime.started(settings.horovod_env(config)) as world:
        ...     train(world)
    """
    before = dict(os.environ)
    set_up: dict[str, str] | None = None
    try:
        world = init(settings)
        set_up = dict(os.environ)
        yield world
    finally:   # where init() failed half-way, all that changed is the run's
        caller.give_back(os.environ, before, dict(os.environ) if set_up is None else set_up)


def start(settings: dict[str, str] | None = None) -> World:
    """`init(settings)` that leaves os.environ as it was: for an object that starts Horovod and runs later, each
    run inside `started()` (a Trainer: built, then fit(); without settings, `started()` sets the start's
    variables and RANK & co. again for the block and gives them back after)."""
    with started(settings) as world:
        return world


def world() -> World:
    """Who we are now (it changes after an elastic reset)."""
    return World(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), "horovod")


def native_bf16() -> bool:
    """Whether this Horovod has a bfloat16 data type (hvdtrain's patched build: scripts/horovod/patches, 0007)."""
    return hvd is not None and hasattr(hvd.mpi_ops.mpi_lib, BF16_BINDING)


def backend_name() -> str:
    """How the ranks talk: 'Gloo', 'MPI', or 'one process'."""
    if hvd.size() == 1:
        return "one process"
    return "MPI" if hvd.mpi_enabled() else "Gloo" if hvd.gloo_enabled() else "Horovod"


def shutdown() -> None:
    if hvd is not None and hvd.is_initialized():
        hvd.shutdown()


def built_info() -> dict[str, bool]:
    h = require()
    return {"mpi": h.mpi_built(), "gloo": h.gloo_built(), "nccl": bool(h.nccl_built())}


# Horovod's rank is the answer everywhere once it runs.
process.use_horovod(lambda: world() if hvd is not None and hvd.is_initialized() else None)
