"""Functions the launcher tests send to real workers (horovodrun and Spark alike)."""


def _raise_on_rank_1():
    import torch

    from hvdtrain.distributed import dist

    world = dist.init()
    if world.rank == 1:
        raise ValueError("planted failure on rank 1")
    dist.allreduce_sum(torch.tensor([1.0]), name="waits_for_rank_1")
    return "unreachable"


def _secret_seen_and_leaks(name):
    """On a worker: whether `name` arrived, and every command line on this machine that holds its value."""
    import os
    from pathlib import Path

    value = os.environ.get(name)
    leaks = []
    for pid in (entry for entry in os.listdir("/proc") if entry.isdigit()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if value and value.encode() in cmdline:
            leaks.append(cmdline.replace(b"\0", b" ").decode(errors="replace")[:200])
    return value, leaks
