"""One benchmark process (one rank): a training-step variant or an allreduce sweep, timed in-process.

Launched by benchmarks/run.py, never by hand: directly (one process), under horovodrun (Horovod
variants) or under torchrun (DDP, torch.distributed). Rank 0 writes its JSON record to --result and
prints a short `BENCH {json}` summary line.

Every step variant is timed the same way: a forward pre-hook stamps the start of each training
forward pass, so a step's time is the gap between consecutive stamps. That covers the data loader,
forward, backward, gradient exchange and optimizer, and leaves out evaluation (model.eval()).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Subset

from hvdtrain.config.train_config import TrainConfig, load_config
from hvdtrain.data.datasets import build_data
from hvdtrain.models.builtin import build_model

# The two workloads of the issue: a comm-heavy MLP (2.9 M params, little compute per byte) and a
# compute-heavy small CNN (convolutions at 28x28, 0.15 M params).
MODELS = {
    "mlp": {"model": "mlp", "hidden": 1024, "batch_size": 64, "synthetic_shape": "1,28,28"},
    "cnn": {"model": "cnn", "hidden": 128, "batch_size": 32, "synthetic_shape": "1,28,28"},
}
SMOKE_MODELS = {
    "mlp": {"model": "mlp", "hidden": 64, "batch_size": 16, "synthetic_shape": "1,8,8"},
    "cnn": {"model": "cnn", "hidden": 16, "batch_size": 8, "synthetic_shape": "1,8,8"},
}


def bench_config(model: str, steps: int, size: int, smoke: bool, threads: int,
                 extra: list[str] | None = None) -> TrainConfig:
    """The trainer's config for a workload: enough samples that every timed step lies in epoch one."""
    spec = (SMOKE_MODELS if smoke else MODELS)[model]
    samples = (steps + 2) * int(spec["batch_size"]) * size * 2
    values = {**spec, "dataset": "synthetic", "synthetic_samples": samples, "val_fraction": 0.05,
              "max_steps": steps, "threads": threads, "run_dir": "", "lr_scaling": "none", "warmup_epochs": 0,
              "lr_decay": "none", "lr": 0.01, "device": "cpu"}
    return load_config(None, [f"--{k.replace('_', '-')}={v}" for k, v in values.items()] + (extra or []))


class StepClock:
    """Stamps the start of every training forward pass of `model`."""

    def __init__(self, model: nn.Module) -> None:
        self.stamps: list[float] = []
        self.cpu_stamps: list[float] = []  # CPU time of the whole process (all its threads)
        model.register_forward_pre_hook(self._stamp)

    def _stamp(self, module: nn.Module, args: Any) -> None:
        if module.training:
            self.stamp()

    def stamp(self) -> None:
        self.stamps.append(time.perf_counter())
        self.cpu_stamps.append(time.process_time())

    def step_ms(self, warmup: int) -> list[float]:
        return _gaps_ms(self.stamps)[warmup:]

    def cpu_ms(self, warmup: int) -> list[float]:
        """CPU time per step. With the rank pinned to one core, cpu / wall near 1 means that core had
        no idle time left in which communication could have overlapped compute."""
        return _gaps_ms(self.cpu_stamps)[warmup:]


def _gaps_ms(stamps: list[float]) -> list[float]:
    return [(b - a) * 1e3 for a, b in zip(stamps, stamps[1:], strict=False)]


def pin(rank: int) -> int | None:
    """One core per rank (rank modulo cores); returns the core, or None where affinity is unsupported."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    core = cores[rank % len(cores)]
    os.sched_setaffinity(0, {core})
    return core


def local_loader(config: TrainConfig, rank: int, size: int) -> tuple[Any, DataLoader]:
    data = build_data(config)
    shard = Subset(data.train, range(rank, len(data.train), size))
    return data, DataLoader(shard, batch_size=config.batch_size)


def plain_loop(model: nn.Module, optimizer: Any, loader: DataLoader, steps: int) -> None:
    """The hand-written step every loop variant shares: what a user would write."""
    model.train()
    done = 0
    while done < steps:
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(inputs), targets)
            loss.backward()
            optimizer.step()
            done += 1
            if done >= steps:
                return


def run_steps(args: argparse.Namespace) -> dict[str, Any]:
    total = args.warmup + args.steps + 1
    rank, size = 0, 1
    hvd: Any = None
    if args.variant in ("hvdtrain", "horovod", "allreduce") or args.launcher == "horovodrun":
        import horovod.torch as hvd

        hvd.init()
        rank, size = hvd.rank(), hvd.size()
    elif args.variant == "ddp":
        import torch.distributed as tdist

        tdist.init_process_group("gloo")
        rank, size = tdist.get_rank(), tdist.get_world_size()
    core = pin(int(os.environ.get("LOCAL_RANK", os.environ.get("HOROVOD_LOCAL_RANK", rank)))) if args.pin else None
    torch.set_num_threads(args.threads)
    config = bench_config(args.model, total, size, args.smoke, args.threads,
                          args.hvdtrain_args.split() if args.variant == "hvdtrain" else None)
    torch.manual_seed(config.seed)
    data, loader = local_loader(config, rank, size)
    model = build_model(config, tuple(data.train[0][0].shape), data.num_classes)
    clock = StepClock(model)
    params = sum(p.numel() for p in model.parameters())

    if args.variant == "hvdtrain":
        import hvdtrain

        hvdtrain.Trainer(model, data.train, data.val, config=config).fit()
    elif args.variant == "horovod":
        optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        plain_loop(model, optimizer, loader, total)
    elif args.variant == "ddp":
        ddp = nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=config.lr, momentum=config.momentum)
        plain_loop(ddp, optimizer, loader, total)
    elif args.variant in ("single", "compute"):
        # compute: each rank trains alone (no gradient exchange) while the others do the same.
        optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
        plain_loop(model, optimizer, loader, total)
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

    if args.variant == "ddp":
        tdist.destroy_process_group()  # gloo's threads left running at exit can abort the process
    times = clock.step_ms(args.warmup)
    cpu = clock.cpu_ms(args.warmup)
    return {"kind": "step", "variant": args.variant, "model": args.model, "np": size, "rank": rank,
            "core": core, "params": params, "grad_bytes": 4 * params, "batch_size": config.batch_size,
            "step_ms": times, "best_ms": min(times), "median_ms": statistics.median(times),
            "cpu_ms": cpu, "median_cpu_ms": statistics.median(cpu)}


def run_sweep(args: argparse.Namespace) -> dict[str, Any]:
    """Allreduce bandwidth: Horovod (whatever ops the launcher chose), torch.distributed gloo, or memcpy."""
    rank, size = 0, 1
    if args.variant == "bw-horovod":
        import horovod.torch as hvd

        hvd.init()
        rank, size = hvd.rank(), hvd.size()
    elif args.variant == "bw-torch":
        import torch.distributed as tdist

        tdist.init_process_group("gloo")
        rank, size = tdist.get_rank(), tdist.get_world_size()
    if args.pin:
        pin(rank)
    torch.set_num_threads(args.threads)
    rows = []
    for mb in args.sizes:
        n = int(mb * 2**20) // 4
        src = torch.ones(n)
        dst = torch.empty(n)
        times = []
        for i in range(args.iters + 1):
            start = time.perf_counter()
            if args.variant == "bw-horovod":
                hvd.allreduce_(src, op=hvd.Sum, name=f"bw.{mb}")
            elif args.variant == "bw-torch":
                tdist.all_reduce(src)
            else:
                dst.copy_(src)
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
    parser.add_argument("--sizes", type=lambda s: [float(x) for x in s.split(",")], default=[1, 4, 16, 64])
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--result", help="file for rank 0's JSON record (benchmarks.run reads it)")
    parser.add_argument("--hvdtrain-args", default="", help="extra hvdtrain flags for the hvdtrain variant, "
                        "e.g. '--nonfinite-limit 0'")
    args = parser.parse_args()
    result = run_sweep(args) if args.variant.startswith("bw-") else run_steps(args)
    if result["rank"] == 0:
        if args.result:
            # A file, not only stdout: launchers may split or interleave a long line (seen under --mpi).
            Path(args.result).write_text(json.dumps(result))
        print(f"BENCH {json.dumps({k: v for k, v in result.items() if k not in ('step_ms', 'cpu_ms')})}", flush=True)


if __name__ == "__main__":
    main()
