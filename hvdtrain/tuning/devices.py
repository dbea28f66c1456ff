"""Which GPUs each of the K trials running at once may use: an equal, disjoint slice per trial.

`hvdtrain tune --parallel K` starts K `horovodrun` jobs on the same host(s). Without a split, every
trial's workers would pick GPUs 0.. by local rank, so K trials would share the same GPUs (NCCL refuses
two ranks of one job on a GPU; two jobs on one GPU just contend). Each trial job gets
`CUDA_VISIBLE_DEVICES` with its own slice, which horovodrun passes on to its workers.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from hvdtrain.errors import ConfigError


def visible_gpus(environ: Mapping[str, str], count: int) -> list[str]:
    """The GPU ids this process may hand out: CUDA_VISIBLE_DEVICES's entries when set, else 0..count-1.

    Example:
        >>> visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}, 8), visible_gpus({}, 2)
        (['2', '3'], ['0', '1'])
    """
    given = environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [part.strip() for part in given.split(",") if part.strip()]
    return [str(i) for i in range(count)]


def trial_gpus(slot: int, parallel: int, gpus_per_trial: int, visible: Sequence[str]) -> str | None:
    """CUDA_VISIBLE_DEVICES for the trial running in `slot` (0..parallel-1), or None without GPUs (CPU).

    Args:
        slot: which of the `parallel` concurrent trials this is; a finished trial frees its slot.
        parallel: trials at once (--parallel K).
        gpus_per_trial: GPUs one trial needs on each host (workers per host x --stages).
        visible: the GPU ids of this host (see `visible_gpus`).
    Returns:
        A comma-separated slice of `visible`, disjoint from every other slot's.
    Example:
        >>> [trial_gpus(s, 2, 2, ["0", "1", "2", "3"]) for s in range(2)]
        ['0,1', '2,3']
    """
    if not visible:
        return None
    share = len(visible) // parallel
    if share < gpus_per_trial:
        fits = len(visible) // gpus_per_trial
        raise ConfigError(f"--parallel {parallel} trials x {gpus_per_trial} GPU(s) each need "
                          f"{parallel * gpus_per_trial} GPUs but {len(visible)} are visible; use "
                          + (f"--parallel {fits} or " if fits else "") + "--device cpu")
    return ",".join(visible[slot * share:(slot + 1) * share])


def workers_per_host(np: int, hosts: str | None) -> int:
    """The most workers one host runs: np on localhost, else the largest slot count in `-H h1:n1,h2:n2`.

    Example:
        >>> workers_per_host(4, None), workers_per_host(4, "a:1,b:3")
        (4, 3)
    """
    if not hosts:
        return np
    return max(int(part.rsplit(":", 1)[1]) if ":" in part else 1 for part in hosts.split(",") if part)
