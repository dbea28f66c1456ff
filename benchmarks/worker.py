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
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Subset

from benchmarks.workloads import MODELS, config_values, is_tokens, narrow_resnet, token_step, token_workload
from hvdtrain.config.train_config import TrainConfig, load_config
from hvdtrain.data.datasets import build_data
from hvdtrain.models.builtin import build_model
from hvdtrain.models.zoo import resnet18


def bench_config(model: str, steps: int, size: int, smoke: bool, threads: int,
                 extra: list[str] | None = None, device: str = "cpu", precision: str = "fp32") -> TrainConfig:
    """The trainer's config for a workload: enough samples that every timed step lies in epoch one."""
    spec = config_values(model, smoke)
    samples = (steps + 2) * int(spec["batch_size"]) * size * 2
    values = {**spec, "dataset": "synthetic", "synthetic_samples": samples, "val_fraction": 0.05,
              "max_steps": steps, "threads": threads, "run_dir": "", "lr_scaling": "none", "warmup_epochs": 0,
              "lr_decay": "none", "lr": 0.01, "device": device, "precision": precision}
    return load_config(None, [f"--{k.replace('_', '-')}={v}" for k, v in values.items()] + (extra or []))


def thread_cpu_ms() -> dict[int, tuple[str, float]]:
    """CPU time (user + system, ms) of every thread of this process: {tid: (name, ms)}. Linux only."""
    tick = 1e3 / os.sysconf("SC_CLK_TCK")
    found = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue  # the thread ended
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is field 3
        found[int(task.name)] = (stat[stat.index("(") + 1:stat.rindex(")")], (int(fields[11]) + int(fields[12])) * tick)
    return found


class ThreadLedger:
    """Which threads exist when (before init, after the communication init, later), and the CPU time
    each used over the timed steps: tells the rank's main thread apart from Horovod's background
    thread (or DDP's gloo threads) without a profiler."""

    def __init__(self) -> None:
        self.known: dict[int, str] = {}
        self.mark("before-init")
        self.first: dict[int, tuple[str, float]] = {}
        self.last: dict[int, tuple[str, float]] = {}

    def mark(self, tag: str) -> None:
        if not Path("/proc/self/task").exists():
            return
        for tid in thread_cpu_ms():
            self.known.setdefault(tid, "main" if tid == os.getpid() else tag)

    def start(self) -> None:
        self.first = thread_cpu_ms() if Path("/proc/self/task").exists() else {}

    def stop(self) -> None:
        self.last = thread_cpu_ms() if self.first else {}

    def per_step(self, steps: int) -> list[dict[str, Any]] | None:
        """CPU ms per timed step of each thread that used any, busiest first; None where not measured.

        /proc counts CPU in 10 ms ticks: over a few short steps (the smoke run) no thread may show any."""
        if not self.first or not self.last or steps <= 0:
            return None
        rows = []
        for tid, (name, ms) in self.last.items():
            used = ms - self.first.get(tid, (name, 0.0))[1]
            if used > 0:
                rows.append({"tid": tid, "name": name, "born": self.known.get(tid, "during-steps"),
                             "cpu_ms_per_step": used / steps})
        return sorted(rows, key=lambda r: -r["cpu_ms_per_step"])


class StepClock:
    """Stamps the start of every training forward pass of `model`. With `sync` (CUDA), waits for the
    device first, so a stamp marks the end of the previous step's GPU work too."""

    def __init__(self, model: nn.Module, ledger: ThreadLedger | None = None, warmup: int = 0, total: int = 0,
                 sync: bool = False) -> None:
        self.stamps: list[float] = []
        self.cpu_stamps: list[float] = []  # CPU time of the whole process (all its threads)
        self.ledger, self.warmup, self.total, self.sync = ledger, warmup, total, sync
        # benchmarks.network: the host's interface, counted over exactly the timed steps (one rank per host)
        self.iface = os.environ.get("BENCH_IFACE", "")
        self.tx: list[int | None] = []
        model.register_forward_pre_hook(self._stamp)

    def _stamp(self, module: nn.Module, args: Any) -> None:
        if module.training:
            self.stamp()

    def stamp(self) -> None:
        if self.sync:
            torch.cuda.synchronize()
        self.stamps.append(time.perf_counter())
        self.cpu_stamps.append(time.process_time())
        if self.ledger is not None and len(self.stamps) == self.warmup + 1:
            self.ledger.start()  # per-thread CPU over exactly the timed steps
        if self.ledger is not None and len(self.stamps) == self.total:
            self.ledger.stop()
        if self.iface and len(self.stamps) in (self.warmup + 1, self.total):
            self.tx.append(tx_bytes(self.iface))

    def tx_bytes_per_step(self) -> float | None:
        """Bytes this host sent per timed step (counters, not assumed), None where not counted."""
        if len(self.tx) != 2 or None in self.tx or self.total - self.warmup - 1 <= 0:
            return None
        first, last = self.tx
        assert first is not None and last is not None
        return (last - first) / (self.total - self.warmup - 1)

    def step_ms(self, warmup: int) -> list[float]:
        return _gaps_ms(self.stamps)[warmup:]

    def cpu_ms(self, warmup: int) -> list[float]:
        """CPU time per step. With the rank pinned to one core, cpu / wall near 1 means that core had
        no idle time left in which communication could have overlapped compute."""
        return _gaps_ms(self.cpu_stamps)[warmup:]


def tx_bytes(iface: str) -> int | None:
    """Bytes this network namespace has sent through `iface` (/proc/net/dev is per namespace), or None."""
    for line in Path("/proc/net/dev").read_text().splitlines()[2:]:
        name, _, counters = line.partition(":")
        if name.strip() == iface:
            return int(counters.split()[8])  # receive has 8 fields (bytes first), then transmit bytes
    return None


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


def to(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, dict):
        return {key: value.to(device, non_blocking=True) for key, value in batch.items()}
    return [value.to(device, non_blocking=True) for value in batch]


def batch_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    if isinstance(batch, dict):
        return token_step(model, batch)
    inputs, targets = batch
    return nn.functional.cross_entropy(model(inputs), targets)


def plain_loop(model: nn.Module, optimizer: Any, loader: DataLoader, steps: int, device: torch.device,
               precision: str = "fp32", horovod: bool = False) -> None:
    """The hand-written step every loop variant shares: what a user would write.

    precision bf16/fp16: autocast forward and loss; fp16 adds a GradScaler (with Horovod, the
    documented order: synchronize, unscale, then step without a second synchronize)."""
    from hvdtrain.train.precision import autocast, make_scaler

    scaler = make_scaler(precision, device)
    model.train()
    done = 0
    while done < steps:
        for batch in loader:
            optimizer.zero_grad()
            with autocast(precision, device):
                loss = batch_loss(model, to(batch, device))
            if scaler is None:
                loss.backward()
                optimizer.step()
            else:
                scaler.scale(loss).backward()
                if horovod:
                    optimizer.synchronize()
                scaler.unscale_(optimizer)
                if horovod:
                    with optimizer.skip_synchronize():
                        scaler.step(optimizer)
                else:
                    scaler.step(optimizer)
                scaler.update()
            done += 1
            if done >= steps:
                return


def local_rank(rank: int) -> int:
    return int(os.environ.get("LOCAL_RANK", os.environ.get("HOROVOD_LOCAL_RANK", rank)))


def pick(device: str, rank: int) -> torch.device:
    """cpu, or (cuda) the GPU of this rank's local rank: one GPU per rank, as hvdtrain pins it."""
    if device != "cuda":
        return torch.device("cpu")
    torch.cuda.set_device(local_rank(rank) % torch.cuda.device_count())
    return torch.device("cuda", torch.cuda.current_device())


def workload(args: argparse.Namespace, config: TrainConfig, rank: int, size: int) -> dict[str, Any]:
    """The model, full train/val data, this rank's shard loader and (dict batches) hvdtrain's step_fn."""
    if is_tokens(args.model):
        model, train, val = token_workload(args.model, args.smoke, config.synthetic_samples, config.seed)
        step_fn: Any = token_step
    else:
        data = build_data(config)
        train, val, step_fn = data.train, data.val, None
        width = narrow_resnet(args.model, args.smoke)
        model = (build_model(config, tuple(data.train[0][0].shape), data.num_classes) if width is None
                 else resnet18(data.train[0][0].shape[0], data.num_classes, width=width))
    shard = Subset(train, range(rank, len(train), size))
    return {"model": model, "train": train, "val": val, "step_fn": step_fn,
            "loader": DataLoader(shard, batch_size=config.batch_size, pin_memory=args.device == "cuda")}


def run_steps(args: argparse.Namespace) -> dict[str, Any]:
    total = args.warmup + args.steps + 1
    rank, size = 0, 1
    hvd: Any = None
    ledger = ThreadLedger()
    if args.variant in ("hvdtrain", "horovod", "allreduce") or args.launcher == "horovodrun":
        import horovod.torch as hvd

        if args.variant == "hvdtrain":
            from hvdtrain.distributed import runtime, settings

            # hvdtrain's own start, with its defaults and any Horovod settings in --hvdtrain-args
            # (the Trainer then finds Horovod running with the same settings)
            runtime.init(settings.horovod_env(load_config(None, args.hvdtrain_args.split())))
        else:
            hvd.init()
        rank, size = hvd.rank(), hvd.size()
    elif args.variant == "ddp":
        import torch.distributed as tdist

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

    if args.variant == "hvdtrain":
        import hvdtrain

        hvdtrain.Trainer(model, work["train"], work["val"], config=config, step_fn=work["step_fn"]).fit()
    elif args.variant == "horovod":
        optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        plain_loop(model, optimizer, work["loader"], total, device, args.precision, horovod=True)
    elif args.variant == "ddp":
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=config.lr, momentum=config.momentum)
        plain_loop(ddp, optimizer, work["loader"], total, device, args.precision)
    elif args.variant in ("single", "compute"):
        # compute: each rank trains alone (no gradient exchange) while the others do the same.
        optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
        plain_loop(model, optimizer, work["loader"], total, device, args.precision)
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
            "tx_bytes_per_step": clock.tx_bytes_per_step(), "compression": compression(args)}


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
    args = parser.parse_args()
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
