"""Functions the launcher tests send to real workers (horovodrun and Spark alike)."""


def _raise_on_rank_1():
    import torch

    from hvdtrain.distributed import collectives, runtime

    world = runtime.init()
    if world.rank == 1:
        raise ValueError("planted failure on rank 1")
    collectives.allreduce_sum(torch.tensor([1.0]), name="waits_for_rank_1")
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


def _wait_cpu(late_s):
    """Rank 1 joins an allreduce late_s late, twice; rank 0's main-thread CPU while it waits: hvdtrain's
    wait, then Horovod's own (HVDTRAIN_WAIT=spin)."""
    import os
    import time

    import torch

    from hvdtrain.distributed import collectives, runtime

    world = runtime.init()
    cpu, verdicts = {}, []
    for mode in ("sleep", "spin"):
        os.environ["HVDTRAIN_WAIT"] = mode
        if world.rank == 1:
            time.sleep(late_s)
        start = time.thread_time()
        flag = collectives.nonfinite_flag_async(torch.tensor(1.0), name=f"late_{mode}")
        verdicts.append(collectives.all_finite(flag))
        cpu[mode] = time.thread_time() - start
    return world.rank, verdicts, cpu
