"""The one module that imports horovod.torch; the rest of `distributed` takes `hvd` from here.

Horovod's start, who we are, and how the ranks talk. The package is split by concern, as Horovod's own
`horovod/torch` is: settings (what hvd.init reads), collectives, gradients (DistributedOptimizer),
wait, wire (bfloat16 on the wire), sync_bn, elastic_state.
"""
from __future__ import annotations

import os
from typing import Any

from hvdtrain.distributed.settings import gloo_defaults, idle_defaults, mpi_defaults, timeout_defaults
from hvdtrain.environment import process
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


def require() -> Any:
    if hvd is None:
        raise UserError(f"Horovod is not usable here ({IMPORT_ERROR}); run `make setup` "
                        "or scripts/install-horovod, then `hvdtrain doctor`")
    return hvd


def init(settings: dict[str, str] | None = None) -> World:
    """Start Horovod (idempotent) with `settings` (see horovod_env) and say who we are."""
    h = require()
    settings = settings or {}
    if h.is_initialized():
        late = [key for key, value in settings.items() if os.environ.get(key) != value]
        if late:
            raise UserError(f"Horovod is already running in this process, so {', '.join(late)} cannot take "
                            "effect (read once at start); use a new process or notebook kernel")
    else:
        # CUDA's default numbering (fastest first) differs from NVML's, Slurm's and nvidia-smi's (PCI bus order):
        # one order everywhere, unless the user chose one or CUDA is already running (then it is too late).
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        os.environ.update(mpi_defaults(os.environ))  # Open MPI reads these in MPI_Init, inside h.init()
        os.environ.update(settings)  # Horovod's core reads these once, inside init()
        os.environ.update(gloo_defaults(os.environ))  # after the config's settings: autotune wins
        os.environ.update(idle_defaults(os.environ))
        os.environ.update(timeout_defaults(os.environ))  # after them too: the config's or horovodrun's wins
    h.init()
    process.export_rank_env()   # Horovod's answer, for libraries that shard by RANK/WORLD_SIZE
    return world()


def world() -> World:
    """Who we are now (it changes after an elastic reset)."""
    return World(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), "horovod")


def native_bf16() -> bool:
    """Whether this Horovod has a bfloat16 data type (hvdtrain's patched build, scripts/horovod_bf16.py)."""
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
