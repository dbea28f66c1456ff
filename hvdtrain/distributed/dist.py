"""The one module that imports horovod.torch. Everything distributed goes through here."""
from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from hvdtrain.errors import UserError

if TYPE_CHECKING:
    from hvdtrain.config.train_config import TrainConfig

try:
    import horovod.torch as hvd
except ImportError as _err:  # doctor explains; the trainer cannot run without it
    hvd = None
    _IMPORT_ERROR: Exception | None = _err
else:
    _IMPORT_ERROR = None


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int
    local_size: int

    @property
    def is_root(self) -> bool:
        return self.rank == 0


def _require() -> Any:
    if hvd is None:
        raise UserError(f"Horovod is not usable here ({_IMPORT_ERROR}); run `make setup` "
                        "or scripts/install-horovod, then `hvdtrain doctor`")
    return hvd


def horovod_env(config: TrainConfig) -> dict[str, str]:
    """Horovod's own settings asked for in `config`, as the environment variables hvd.init() reads.

    Only what differs from Horovod's defaults, so horovodrun's flags (--timeline-filename, ...) still apply
    when the config says nothing.
    """
    env = {}
    if config.timeline_file:
        env["HOROVOD_TIMELINE"] = os.path.abspath(config.timeline_file)  # written by rank 0 (the coordinator)
    if config.autotune:
        env["HOROVOD_AUTOTUNE"] = "1"
    if config.stall_check_s == 0:
        env["HOROVOD_STALL_CHECK_DISABLE"] = "1"
    elif config.stall_check_s != 60:
        env["HOROVOD_STALL_CHECK_TIME_SECONDS"] = str(config.stall_check_s)
    if config.stall_shutdown_s:
        env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] = str(config.stall_shutdown_s)
    return env


# Open MPI settings hvdtrain sets before MPI_Init (inside hvd.init()), measured in
# benchmarks/README.md ("Issue #20"): at np=2 on one core per rank, Horovod's background thread
# (one small collective per 1 ms cycle) busy-polled 50-165 ms of CPU per CNN step, time the other
# rank's training thread lacked. Gloo jobs ignore them. HVDTRAIN_MPI_DEFAULTS=0 turns them off,
# =yield keeps only the first.
# - yield while waiting (Open MPI does this itself only when it sees more ranks than slots); a value
#   already in the environment wins;
MPI_DEFAULTS = {"OMPI_MCA_mpi_yield_when_idle": "1"}
# - on one host, no OFI (libfabric) BTL: shared memory carries everything there; the OFI BTL's progress
#   (with epoll_wait syscalls) was most of the polling in a perf profile, and its init deadlocked once
#   in MPI_Init (a gdb backtrace in benchmarks/results/2026-12-03-f-mpi-defaults). horovodrun --mpi passes
#   `-mca btl ^openib`, which reaches the ranks as OMPI_MCA_btl=^openib (and beats the launcher's
#   environment), so an exclusion list is extended; a list of BTLs to use is left alone. Not set
#   across hosts, where OFI may be the network.
ONE_HOST_EXCLUDED_BTL = "ofi"


def mpi_defaults(env: Mapping[str, str]) -> dict[str, str]:
    """The Open MPI settings hvdtrain adds for a process with environment `env` (mpirun's
    OMPI_COMM_WORLD_* variables tell whether all ranks share one host).

    Example:
        >>> mpi_defaults({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_btl": "^openib"})
        {'OMPI_MCA_mpi_yield_when_idle': '1', 'OMPI_MCA_btl': '^openib,ofi'}
    """
    choice = env.get("HVDTRAIN_MPI_DEFAULTS", "1")
    if choice == "0":
        return {}
    wanted = {key: value for key, value in MPI_DEFAULTS.items() if key not in env}
    size = env.get("OMPI_COMM_WORLD_SIZE")
    if choice != "yield" and size and size == env.get("OMPI_COMM_WORLD_LOCAL_SIZE"):
        btl = env.get("OMPI_MCA_btl", "")
        if not btl:
            wanted["OMPI_MCA_btl"] = "^" + ONE_HOST_EXCLUDED_BTL
        elif btl.startswith("^") and ONE_HOST_EXCLUDED_BTL not in btl[1:].split(","):
            wanted["OMPI_MCA_btl"] = f"{btl},{ONE_HOST_EXCLUDED_BTL}"
    return wanted


# Horovod's cycle time when its ops run over Gloo (horovodrun --gloo, elastic jobs, hvdtrain.launch):
# every cycle is a coordination round over loopback TCP even when no tensor is waiting, and on one core
# per rank those wake-ups slow the training thread. At 2 ms instead of Horovod's 1: CNN, ResNet-18 and
# transformer faster, the MLP level (benchmarks/README.md, "Issue #20 (2026-12-04)"). Not set for MPI
# ops (slower there at 2 ms, CNN and MLP), with autotune (it tunes the cycle), or over a HOROVOD_CYCLE_TIME of
# the user's.
GLOO_CYCLE_TIME_MS = "2"


def gloo_defaults(env: Mapping[str, str]) -> dict[str, str]:
    """The Horovod settings hvdtrain adds for a process with environment `env` whose ops run over Gloo.

    Example:
        >>> gloo_defaults({"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1"})
        {'HOROVOD_CYCLE_TIME': '2'}
    """
    over_gloo = "HOROVOD_GLOO_RENDEZVOUS_ADDR" in env or env.get("HOROVOD_CONTROLLER") == "gloo"
    if not over_gloo or "HOROVOD_CYCLE_TIME" in env or env.get("HOROVOD_AUTOTUNE", "0") not in ("", "0"):
        return {}
    return {"HOROVOD_CYCLE_TIME": GLOO_CYCLE_TIME_MS}


def init(settings: dict[str, str] | None = None) -> World:
    """Start Horovod (idempotent) with `settings` (see horovod_env) and say who we are."""
    h = _require()
    settings = settings or {}
    if h.is_initialized():
        late = [key for key, value in settings.items() if os.environ.get(key) != value]
        if late:
            raise UserError(f"Horovod is already running in this process, so {', '.join(late)} cannot take "
                            "effect (read once at start); use a new process or notebook kernel")
    else:
        os.environ.update(mpi_defaults(os.environ))  # Open MPI reads these in MPI_Init, inside h.init()
        os.environ.update(settings)  # Horovod's core reads these once, inside init()
        os.environ.update(gloo_defaults(os.environ))  # after the config's settings: autotune wins
    h.init()
    return world()


def world() -> World:
    """Who we are now (it changes after an elastic reset)."""
    return World(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())


def backend_name() -> str:
    """How the ranks talk: 'Gloo', 'MPI', or 'one process'."""
    if hvd.size() == 1:
        return "one process"
    return "MPI" if hvd.mpi_enabled() else "Gloo" if hvd.gloo_enabled() else "Horovod"


def shutdown() -> None:
    if hvd is not None and hvd.is_initialized():
        hvd.shutdown()


def broadcast_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    # Horovod: every rank starts from rank 0's weights and optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)


def wrap_optimizer(optimizer: torch.optim.Optimizer, model: torch.nn.Module, *, accumulate: int = 1,
                   compression: str = "none", op: str = "average",
                   gradient_predivide_factor: float = 1.0) -> torch.optim.Optimizer:
    """Horovod's DistributedOptimizer: gradients are averaged (or Adasum-combined) as backward produces them.

    accumulate: backward passes per step; the allreduce starts in the last one (gradients add up locally).
    compression: "fp16" sends float gradients as float16 and restores their dtype after the allreduce.
    """
    if op == "adasum" and hvd.size() > 1 and not hvd.mpi_enabled():
        raise UserError("op adasum needs Horovod's MPI operations (Gloo has no Adasum): launch with "
                        "horovodrun --mpi, or use --op average")
    return hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none,
        backward_passes_per_step=accumulate, op=hvd.Adasum if op == "adasum" else hvd.Average,
        gradient_predivide_factor=gradient_predivide_factor)


def steps_in_backward(op: str) -> bool:
    """Adasum with several workers applies each tensor's update inside backward, then combines the deltas."""
    return op == "adasum" and hvd.size() > 1


def convert_sync_bn(module: torch.nn.Module, name: str = "") -> torch.nn.Module:
    """Replace every BatchNorm layer with a SyncBatchNorm that shares its parameters and buffers.

    Sharing (not copying) keeps an optimizer built beforehand pointing at the right tensors.
    """
    if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
        sync = SyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                             module.track_running_stats)
        for key, value in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            setattr(sync, key, value)
        sync.train(module.training)
        sync.allreduce_name = f"sync_bn.{name or 'root'}"  # the same on every rank: one module tree
        return sync
    for key, child in module.named_children():
        setattr(module, key, convert_sync_bn(child, f"{name}.{key}" if name else key))
    return module


class SyncBatchNorm(hvd.SyncBatchNorm if hvd is not None else _BatchNorm):  # type: ignore[misc]
    """Horovod's SyncBatchNorm, extended to CPU tensors (Horovod's own kernels are CUDA-only).

    On CPU the training-mode statistics are per-channel sums allreduced with Horovod's differentiable
    allreduce, whose backward sums the statistics' gradients across workers too: forward and backward
    equal one BatchNorm over the global batch. Cost: one small allreduce per layer in forward and one in
    backward. Eval mode and a single worker run plain BatchNorm.
    """

    allreduce_name = "sync_bn"

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.is_cuda:
            return super().forward(input)  # Horovod's CUDA implementation
        if not self.training or hvd.size() == 1:
            return _BatchNorm.forward(self, input)
        self._check_input_dim(input)
        channels, dims = input.shape[1], [0, *range(2, input.dim())]
        wide = input.to(torch.float64)  # float64 sums: E[x^2] - E[x]^2 without cancellation trouble
        local = torch.cat([wide.sum(dims), (wide * wide).sum(dims),
                           torch.tensor([input.numel() / channels], dtype=torch.float64)])
        # Horovod: global sums, identical on every rank, so running statistics stay identical too.
        total = hvd.allreduce(local, op=hvd.Sum, name=self.allreduce_name)
        count = total[-1]
        mean = total[:channels] / count
        var = total[channels:2 * channels] / count - mean * mean
        if self.running_mean is not None and self.running_var is not None:
            self.num_batches_tracked.add_(1)
            momentum = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
            with torch.no_grad():  # as torch's BatchNorm: the unbiased variance goes into the running stats
                self.running_mean.lerp_(mean.to(self.running_mean.dtype), momentum)
                self.running_var.lerp_((var * count / (count - 1)).to(self.running_var.dtype), momentum)
        shape = [1, channels] + [1] * (input.dim() - 2)
        out = ((wide - mean.view(shape)) / torch.sqrt(var.view(shape) + self.eps)).to(input.dtype)
        if self.weight is not None and self.bias is not None:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out


# Horovod's synchronize() waits by spinning: poll, release the GIL, sched_yield, again
# (WaitAndClear in horovod/torch/mpi_ops_v2.cc, 0.28.1). A rank that reaches the allreduce first burns
# its core until the slowest rank arrives and the bytes have moved, and with one core per rank that is
# the core its background threads need to move them (benchmarks/README.md, Issue #20 (2026-12-04),
# "Horovod's synchronize() spins"). hvdtrain sleeps between polls instead, backing off from the first
# to the last interval; synchronize() then finds the op done and returns at once. HVDTRAIN_WAIT=spin
# keeps Horovod's own wait.
WAIT_SLEEP_S = (50e-6, 400e-6)


def wait_quietly(handles: Iterable[Any]) -> None:
    """Return once these Horovod handles are done, sleeping (not spinning) while they are not."""
    if os.environ.get("HVDTRAIN_WAIT") == "spin":
        return
    first, last = WAIT_SLEEP_S
    for handle in handles:
        delay = first
        while not hvd.poll(handle):
            time.sleep(delay)
            delay = min(delay * 2, last)


def synchronize_gradients(optimizer: Any) -> None:
    """DistributedOptimizer.synchronize(), after sleeping until this step's gradient allreduces are done."""
    # Horovod's wrapper keeps {param or group: (handle, ctx)}; a None or callable handle is not an op in flight.
    in_flight = getattr(optimizer, "_handles", {}).values()
    wait_quietly(handle for handle, _ in in_flight if isinstance(handle, int))
    optimizer.synchronize()


def allreduce_sum(tensor: torch.Tensor, name: str) -> torch.Tensor:
    # Alone, a sum is the tensor: skip Horovod's background-thread round trip (as its own
    # DistributedOptimizer does at size 1).
    return tensor.clone() if hvd.size() == 1 else hvd.allreduce(tensor, op=hvd.Sum, name=name)


def average_buffers(buffers: list[torch.Tensor]) -> None:
    """Average float buffers (BatchNorm running statistics) over the ranks, in place, in one grouped op.

    Without it every rank keeps statistics of its own shard: evaluation would differ by rank and the
    replicas would not be equal at the end.
    """
    if hvd.size() == 1 or not buffers:
        return
    averaged = hvd.grouped_allreduce([b.detach() for b in buffers], op=hvd.Average, name="buffers")
    with torch.no_grad():
        for buffer, value in zip(buffers, averaged, strict=True):
            buffer.copy_(value)


def nonfinite_flag_async(value: torch.Tensor, name: str, gradient_predivide_factor: float = 1.0) -> Any:
    """Start the ranks' agreement on whether `value` (one element) is finite on every rank; all_finite() answers.

    Sent after backward as an fp32 average with DistributedOptimizer's own scale factors, so that
    Horovod fuses it into the step's last gradient allreduce instead of negotiating an op of its own
    (an extra op cost up to ~10% of a communication-bound step; benchmarks/README.md)."""
    if hvd.size() == 1:
        return _Done(value.detach())    # one rank agrees with itself: no op, no tensor arithmetic
    flag = (value.detach() * 0).to(torch.float32)  # in the input's precision first: inf * 0 is NaN
    return hvd.allreduce_async_(flag, op=hvd.Average, name=name, prescale_factor=1.0 / gradient_predivide_factor,
                                postscale_factor=gradient_predivide_factor)


@dataclass
class _Done:
    tensor: torch.Tensor


def all_finite(handle: Any) -> bool:
    """The verdict of nonfinite_flag_async, the same on every rank (waits for the allreduce)."""
    if isinstance(handle, _Done):
        # A host read is ~1 us where isfinite().all() costs ~20 us of eager ops a step (on a GPU both sync).
        return math.isfinite(float(handle.tensor))
    wait_quietly([handle])
    return bool(torch.isfinite(hvd.synchronize(handle)).all())


def broadcast_object(obj: Any, name: str) -> Any:
    return hvd.broadcast_object(obj, root_rank=0, name=name)


def allgather_object(obj: Any, name: str) -> list[Any]:
    return hvd.allgather_object(obj, name=name)


def built_info() -> dict[str, bool]:
    h = _require()
    return {"mpi": h.mpi_built(), "gloo": h.gloo_built(), "nccl": bool(h.nccl_built())}


def elastic_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, **values: Any) -> Any:
    """Horovod's TorchState: model, optimizer and plain values saved on commit, restored on failure."""
    return hvd.elastic.TorchState(model=model, optimizer=optimizer, **values)


def run_elastic(fn: Any, while_resetting: Callable[[], AbstractContextManager[Any]] | None = None) -> Any:
    """Wrap fn(state) so Horovod re-runs it from the last commit after a worker joins or leaves.

    `while_resetting()` is entered around Horovod's re-forming of the world (shutdown, then an init that
    blocks until the driver has a new world: below --min-np, possibly for ever).
    """
    from horovod.common.elastic import run_fn

    def reset() -> None:   # hvd.elastic.run's own reset, watched
        with while_resetting() if while_resetting else nullcontext():
            hvd.shutdown()
            hvd.init()

    return run_fn(fn, reset)


@dataclass
class AllreduceCount:
    """Gradient allreduces submitted by Horovod's DistributedOptimizer, as the wire sees them."""
    calls: int = 0
    bytes: int = 0              # after compression: fp16 halves it
    names: list[str] = field(default_factory=list)


@contextmanager
def count_gradient_allreduces() -> Iterator[AllreduceCount]:
    """Count what DistributedOptimizer hands to Horovod (tensor count and bytes) while inside.

    For tests and benchmarks: it wraps the functions horovod.torch.optimizer calls, so the counts are
    of the tensors actually allreduced (compressed ones included), not of what we think we sent.
    Example:
        >>> with dist.count_gradient_allreduces() as count:
        ...     trainer.fit()
        >>> count.bytes / trainer.progress.step   # 4 x parameters in fp32
    """
    from horovod.torch import optimizer as hvd_optimizer

    count = AllreduceCount()
    single, grouped = hvd_optimizer.allreduce_async_, hvd_optimizer.grouped_allreduce_async_

    def record(tensor: torch.Tensor, name: str | None) -> None:
        count.calls += 1
        count.bytes += tensor.numel() * tensor.element_size()
        count.names.append(name or "")

    def counted_single(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        record(tensor, kwargs.get("name"))
        return single(tensor, *args, **kwargs)

    def counted_grouped(tensors: list[torch.Tensor], *args: Any, **kwargs: Any) -> Any:
        for tensor in tensors:
            record(tensor, kwargs.get("name"))
        return grouped(tensors, *args, **kwargs)

    hvd_optimizer.allreduce_async_, hvd_optimizer.grouped_allreduce_async_ = counted_single, counted_grouped
    try:
        yield count
    finally:
        hvd_optimizer.allreduce_async_, hvd_optimizer.grouped_allreduce_async_ = single, grouped
