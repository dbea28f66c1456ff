"""The adapter to the internals of Horovod's DistributedOptimizer (horovod/torch/optimizer.py,
_DistributedOptimizer): every private attribute of it that hvdtrain reads, writes or replaces is a function here.

Why: buckets stepped as they come back (bucket_step.py), a bucket this rank's backward skipped sent as its peers
send it, and each bucket scaled before it is sent (gradients.py) all need the optimizer's bookkeeping, which
Horovod keeps private: its ops in flight (`_handles`), the gradients each bucket still waits for (`_group_counts`,
`_p_to_group`), the backward passes left before a parameter's allreduce (`_allreduce_delay`), its compression,
its parameter names, and the method that sends a bucket (`_grouped_allreduce_grad_async`). They were read from
Horovod 0.28.1 (its last release, distributed/horovod_runner.py's WRITTEN_FOR); a newer Horovod breaks this one
file, and `check_version` refuses another version in one line before any of them is touched.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, cast

import torch

from hvdtrain.distributed import horovod_runner
from hvdtrain.errors import UserError

Bucket = tuple[torch.nn.Parameter, ...]   # Horovod's group: the key of its bookkeeping for one bucket
_checked = threading.Event()


def check_version() -> None:
    """Raise a one-line UserError when the installed Horovod is not the one these internals were read from;
    checked once per process (every function here calls it, so no caller can skip it)."""
    if _checked.is_set():
        return
    found, written_for = horovod_runner.version(), horovod_runner.WRITTEN_FOR
    if found != written_for:
        raise UserError(f"Horovod {found} is installed; hvdtrain's gradient exchange uses Horovod {written_for}'s "
                        f"DistributedOptimizer internals: install Horovod {written_for} (make setup), or update "
                        "hvdtrain/distributed/horovod_optimizer.py")
    _checked.set()


def bucket_groups(optimizer: Any) -> list[Bucket]:
    """Horovod's buckets (DistributedOptimizer(groups=...)), in the order it formed them; [] where it sends each
    gradient alone: no groups, a single rank (Horovod forms none), Adasum's optimizer, or a plain torch one."""
    check_version()
    return list(getattr(optimizer, "_group_counts", None) or ())


def in_flight(optimizer: Any) -> dict[Any, tuple[Any, Any]]:
    """Horovod's ops in flight, {parameter or bucket: (handle, ctx)}, the dict itself ({} for an optimizer without
    one): a caller that waits for an op pops it, as Horovod's synchronize() clears what it waited for. A None or
    callable handle is no op in flight (a parameter whose backward passes are not all done)."""
    check_version()
    handles: dict[Any, tuple[Any, Any]] = getattr(optimizer, "_handles", {})
    return handles


def send_bucket(optimizer: Any, bucket: Bucket) -> None:
    """Send `bucket` as its gradient hooks do once all of its gradients are ready: one grouped allreduce, recorded
    as in flight under the bucket, its count of ready gradients back to 0 (per-parameter records dropped)."""
    check_version()
    handles = in_flight(optimizer)
    for param in bucket:
        handles.pop(param, None)
    handles[bucket] = optimizer._grouped_allreduce_grad_async(bucket)
    optimizer._group_counts[bucket] = 0


def bucket_received(optimizer: Any, bucket: Bucket, outputs: list[torch.Tensor], ctx: Any) -> None:
    """What Horovod's synchronize() does with a bucket's results once its op is done (after hvd.synchronize):
    each gradient set from its output, decompressed; its parameters' backward passes counted from the start.
    `outputs` may end with more than the bucket's gradients (the loss flag): those are left."""
    check_version()
    for param, output, param_ctx in zip(bucket, outputs, ctx, strict=False):
        optimizer._allreduce_delay[param] = optimizer.backward_passes_per_step
        cast(torch.Tensor, param.grad).set_(optimizer._compression.decompress(output, param_ctx))
    optimizer._group_counts[bucket] = 0


def bucket_of(optimizer: Any, param: torch.nn.Parameter) -> Bucket | None:
    """The bucket Horovod put `param` in (the tuple its bookkeeping is keyed by), or None: not in one."""
    check_version()
    found: Bucket | None = getattr(optimizer, "_p_to_group", {}).get(param)
    return found


def parameter_name(optimizer: Any, param: torch.nn.Parameter) -> str | None:
    """The name Horovod gives `param`'s allreduce (from named_parameters): a bucket's op is named after its first
    parameter, the same on every rank, which is how the ranks match one another's ops."""
    check_version()
    name: str | None = optimizer._parameter_names.get(param)
    return name


def replace_bucket_send(optimizer: Any, send: Callable[[Bucket], tuple[Any, list[Any]]]) -> None:
    """Send each of the optimizer's buckets with `send(bucket) -> (handle, one ctx per parameter)` instead of
    Horovod's _grouped_allreduce_grad_async (compress each gradient, grouped allreduce): both its gradient hooks
    and send_bucket call it. The ctx is handed back to the compression's decompress in bucket_received and
    synchronize()."""
    check_version()
    optimizer._grouped_allreduce_grad_async = send
