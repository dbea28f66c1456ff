"""One benchmark process (one rank): a training-step variant or an allreduce sweep, timed in-process.

Launched by benchmarks/run.py, never by hand: directly (one process), under horovodrun (Horovod
variants) or under torchrun (DDP, torch.distributed). Rank 0 writes its JSON record to --result and
prints a short `BENCH {json}` summary line.

This module starts the communication, places the rank (its core, its GPU) and runs the variant:
the Trainer, the hand-written loop (benchmarks/loops.py) under Horovod, DDP or alone, or the bare
allreduce. Every step variant is timed the same way, by benchmarks/clock.py: a forward pre-hook
stamps the start of each training forward pass, so a step's time is the gap between consecutive
stamps (data loader, forward, backward, gradient exchange and optimizer; not evaluation).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.clock import StepClock, ThreadLedger
from benchmarks.loops import bench_config, plain_loop, workload
from benchmarks.workloads import MODELS
from hvdtrain.config.train_config import load_config


def pin(rank: int) -> int | None:
    """One core per rank (rank modulo cores); returns the core, or None where affinity is unsupported."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    core = cores[rank % len(cores)]
    os.sched_setaffinity(0, {core})
    return core


def local_rank(rank: int) -> int:
    return int(os.environ.get("LOCAL_RANK", os.environ.get("HOROVOD_LOCAL_RANK", rank)))


def pick(device: str, rank: int) -> torch.device:
    """cpu, or (cuda) the GPU of this rank's local rank: one GPU per rank, as hvdtrain pins it."""
    if device != "cuda":
        return torch.device("cpu")
    torch.cuda.set_device(local_rank(rank) % torch.cuda.device_count())
    return torch.device("cuda", torch.cuda.current_device())


def gloo_threads(threads: int) -> None:
    """DDP's Gloo group with `threads` worker threads instead of torch's 2 (an A/B knob: Horovod sends its
    buckets one at a time on one thread). init_process_group takes no Gloo options, so the group's class is
    swapped for a subclass that passes them; its device follows GLOO_SOCKET_IFNAME as torch's does."""
    import torch.distributed.distributed_c10d as c10d

    gloo = c10d.ProcessGroupGloo

    class GlooWithThreads(gloo):  # type: ignore[misc,valid-type]
        def __init__(self, store, rank, size, timeout):  # type: ignore[no-untyped-def]
            options = gloo._Options()
            options._timeout, options._threads = timeout, threads
            interface = os.environ.get("GLOO_SOCKET_IFNAME")
            options._devices = [gloo.create_device(interface=interface) if interface
                                else gloo.create_default_device()]
            super().__init__(store, rank, size, options)

    c10d.ProcessGroupGloo = GlooWithThreads  # type: ignore[misc]


def run_steps(args: argparse.Namespace) -> dict[str, Any]:
    total = args.warmup + args.steps + 1
    rank, size = 0, 1
    hvd: Any = None
    ledger = ThreadLedger()
    if args.variant in ("hvdtrain", "horovod", "allreduce") or args.launcher == "horovodrun":
        import horovod.torch as hvd

        if args.variant == "hvdtrain":
            from hvdtrain.distributed import horovod_settings as settings
            from hvdtrain.distributed import runtime

            # hvdtrain's own start, with its defaults and any Horovod settings in --hvdtrain-args
            # (the Trainer then finds Horovod running with the same settings)
            runtime.init(settings.horovod_env(load_config(None, args.hvdtrain_args.split())))
        else:
            hvd.init()
        rank, size = hvd.rank(), hvd.size()
    elif args.variant == "ddp":
        import torch.distributed as tdist

        if os.environ.get("BENCH_GLOO_THREADS"):
            gloo_threads(int(os.environ["BENCH_GLOO_THREADS"]))
        tdist.init_process_group("nccl" if args.device == "cuda" else "gloo")
        rank, size = tdist.get_rank(), tdist.get_world_size()
    ledger.mark("comm-init")  # Horovod's background thread, or DDP's gloo threads
    core = pin(local_rank(rank)) if args.pin else None
    torch.set_num_threads(args.threads)
    device = pick(args.device, rank)
    config = bench_config(args.model, total, size, args.smoke, args.threads,
                          args.hvdtrain_args.split() if args.variant == "hvdtrain" else None,
                          device=args.device, precision=args.precision)
    torch.manual_seed(config.seed)
    work = workload(args, config, rank, size)
    model = work["model"].to(device)
    clock = StepClock(model, ledger, args.warmup, total, sync=device.type == "cuda")
    params = sum(p.numel() for p in model.parameters())
    ledger.mark("setup")

    # --compile: the plain loops get torch.compile(model) (DDP: compile(DDP(model)), so DDPOptimizer splits the
    # graph at its buckets); hvdtrain its own --compile (its Trainer compiles the model block by block). The
    # clock's hook stays on the plain module, called inside.
    run_model = torch.compile(model) if args.compile and args.variant in ("horovod", "single", "compute") else model
    if args.variant == "hvdtrain":
        import hvdtrain

        hvdtrain.Trainer(model, work["train"], work["val"], config=config, step_fn=work["step_fn"]).fit()
    elif args.variant == "horovod":
        optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        plain_loop(run_model, optimizer, work["loader"], total, device, args.precision, horovod=True)
    elif args.variant == "ddp":
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=config.lr, momentum=config.momentum)
        loop_model = torch.compile(ddp) if args.compile else ddp
        plain_loop(loop_model, optimizer, work["loader"], total, device, args.precision)
    elif args.variant in ("single", "compute"):
        # compute: each rank trains alone (no gradient exchange) while the others do the same.
        optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
        plain_loop(run_model, optimizer, work["loader"], total, device, args.precision)
    elif args.variant == "allreduce":
        # The gradient traffic of one step with no compute: every parameter-shaped tensor, async, then wait.
        grads = [(name, torch.randn_like(p)) for name, p in model.named_parameters()]
        for _ in range(total):
            clock.stamp()
            handles = [hvd.allreduce_async_(g, name=f"allreduce.{name}") for name, g in reversed(grads)]
            for handle in handles:
                hvd.synchronize(handle)
    else:
        raise SystemExit(f"unknown variant {args.variant}")

    threads = ledger.per_step(args.steps)
    if args.variant == "ddp":
        tdist.destroy_process_group()  # gloo's threads left running at exit can abort the process
    times = clock.step_ms(args.warmup)
    cpu = clock.cpu_ms(args.warmup)
    return {"kind": "step", "variant": args.variant, "model": args.model, "np": size, "rank": rank,
            "core": core, "device": device.type, "precision": args.precision, "params": params,
            "grad_bytes": 4 * params, "batch_size": config.batch_size,
            "step_ms": times, "best_ms": min(times), "median_ms": statistics.median(times),
            "cpu_ms": cpu, "median_cpu_ms": statistics.median(cpu), "threads_cpu": threads,
            "tx_bytes_per_step": clock.tx_bytes_per_step(), "compression": compression(args), "compile": args.compile}


def compression(args: argparse.Namespace) -> str:
    """What the hvdtrain variant put on the wire (its --compression), 'none' for every other variant."""
    flags = args.hvdtrain_args.split() if args.variant == "hvdtrain" else []
    for index, flag in enumerate(flags):
        if flag.startswith("--compression="):
            return flag.split("=", 1)[1]
        if flag == "--compression" and index + 1 < len(flags):
            return flags[index + 1]
    return "none"


def run_sweep(args: argparse.Namespace) -> dict[str, Any]:
    """Allreduce bandwidth: Horovod (whatever ops the launcher chose), torch.distributed (gloo; NCCL on
    cuda), or memcpy."""
    rank, size = 0, 1
    if args.variant == "bw-horovod":
        import horovod.torch as hvd

        hvd.init()
        rank, size = hvd.rank(), hvd.size()
    elif args.variant == "bw-torch":
        import torch.distributed as tdist

        tdist.init_process_group("nccl" if args.device == "cuda" else "gloo")
        rank, size = tdist.get_rank(), tdist.get_world_size()
    if args.pin:
        pin(local_rank(rank))
    torch.set_num_threads(args.threads)
    device = pick(args.device, rank)
    rows = []
    for mb in args.sizes:
        n = int(mb * 2**20) // 4
        src = torch.ones(n, device=device)
        dst = torch.empty(n, device=device)
        times = []
        for i in range(args.iters + 1):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            if args.variant == "bw-horovod":
                hvd.allreduce_(src, op=hvd.Sum, name=f"bw.{mb}")
            elif args.variant == "bw-torch":
                tdist.all_reduce(src)
            else:
                dst.copy_(src)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i:  # the first call sets up buffers and connections
                times.append(time.perf_counter() - start)
            src.fill_(1.0)  # keeps values finite; outside the timed region
        best = min(times)
        nbytes = n * 4
        # Bus bandwidth (NCCL-tests convention): algorithm bandwidth x 2(n-1)/n, comparable across sizes
        # of world; a memory copy reads and writes each byte once, reported as bytes / time.
        factor = 2 * (size - 1) / size if args.variant != "bw-memcpy" else 1.0
        rows.append({"size_mb": mb, "bytes": nbytes, "best_ms": best * 1e3,
                     "median_ms": statistics.median(times) * 1e3, "busbw_gbs": nbytes * factor / best / 1e9})
    if args.variant == "bw-torch":
        tdist.destroy_process_group()  # gloo's threads left running at exit can abort the process
    return {"kind": "bandwidth", "variant": args.variant, "np": size, "rank": rank, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variant", required=True)
    parser.add_argument("--model", default="mlp", choices=sorted(MODELS))
    parser.add_argument("--launcher", default="python", choices=["python", "horovodrun", "torchrun"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--pin", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="cuda: one GPU per rank (local rank), DDP on NCCL, a device sync at each stamp")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                        help="autocast forward/loss (fp16: CUDA only, with a GradScaler)")
    parser.add_argument("--sizes", type=lambda s: [float(x) for x in s.split(",")], default=[1, 4, 16, 64])
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--result", help="file for rank 0's JSON record (benchmarks.run reads it)")
    parser.add_argument("--hvdtrain-args", default="", help="extra hvdtrain flags for the hvdtrain variant, "
                        "e.g. '--nonfinite-limit 0'")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (hvdtrain: its --compile)")
    args = parser.parse_args()
    # BENCH_COMPILE=1 in a benchmarks.ab setting compiles that setting alone (eager and compiled alternated)
    args.compile = args.compile or os.environ.get("BENCH_COMPILE") == "1"
    if args.compile and args.variant == "hvdtrain":
        args.hvdtrain_args = f"{args.hvdtrain_args} --compile true".strip()
    result = run_sweep(args) if args.variant.startswith("bw-") else run_steps(args)
    if args.result and os.environ.get("BENCH_IFACE") and result.get("tx_bytes_per_step") is not None:
        # every rank's own counter (benchmarks.network): the hosts share this filesystem
        Path(f"{args.result}.rank{result['rank']}").write_text(json.dumps(
            {"rank": result["rank"], "tx_bytes_per_step": result["tx_bytes_per_step"]}))
    if result["rank"] == 0:
        if args.result:
            # A file, not only stdout: launchers may split or interleave a long line (seen under --mpi).
            Path(args.result).write_text(json.dumps(result))
        print(f"BENCH {json.dumps({k: v for k, v in result.items() if k not in ('step_ms', 'cpu_ms', 'threads_cpu')})}",
              flush=True)
    if args.launcher == "torchrun":
        # torch's gloo process group can abort the process while the interpreter tears down, after
        # destroy_process_group ("terminate called without an active exception": 1 run in 6 here, and
        # twice in a row in CI). The record is written and flushed: leave without the teardown.
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
