"""The trainer's own cost per step at np=1: hvdtrain.Trainer and the hand-written Horovod loop, taking
turns in ONE process.

    python -m benchmarks.overhead --model mlp --rounds 12 --out benchmarks/results/DATE-x-what

benchmarks.run starts every variant as a process of its own, and on a shared 2-core VM one process
can run 10-30% slower than the next for its whole life (the same variant's round medians spread from
9.4 to 13.3 ms on the MLP). A 2% difference then hides in the noise, and a best-of-3 ratio moves by
more than the 0.97 bar on its own. Here both loops share the heap, the core and the moment: each
round builds the model afresh (same seed), runs the Trainer for --steps steps and the hand loop for
as many, in alternating order, and keeps each one's median step. The summary is the median of those
medians, the ratio hand/hvdtrain (1.0 = no overhead), and the difference in microseconds per step:
the trainer's bookkeeping (LR schedule, metric sums, the loss check, the log interval's allreduce).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
from pathlib import Path
from typing import Any

import torch

from benchmarks.clock import StepClock
from benchmarks.loops import bench_config, plain_loop, workload
from benchmarks.workloads import MODELS

WARMUP = 10


def one_round(order: list[str], args: argparse.Namespace, config: Any, hvd: Any) -> dict[str, float]:
    import hvdtrain

    medians = {}
    for variant in order:
        torch.manual_seed(config.seed)
        work = workload(args, config, 0, 1)
        model = work["model"]
        clock = StepClock(model)
        if variant == "hvdtrain":
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                hvdtrain.Trainer(model, work["train"], None, config=config, step_fn=work["step_fn"]).fit()
        else:
            optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
            optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
            plain_loop(model, optimizer, work["loader"], config.max_steps, torch.device("cpu"), horovod=True)
        medians[variant] = statistics.median(clock.step_ms(WARMUP))
    return medians


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mlp", choices=sorted(MODELS))
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=150, help="timed steps per loop and round (after 10 warm-up)")
    parser.add_argument("--smoke", action="store_true", help="tiny model: checks the tool, not speed")
    parser.add_argument("--out", help="folder for overhead_MODEL.json")
    args = parser.parse_args(argv)
    args.device = "cpu"
    import horovod.torch as hvd

    from hvdtrain.distributed import horovod_settings as settings
    from hvdtrain.distributed import runtime

    config = bench_config(args.model, args.steps + WARMUP + 1, 1, args.smoke, 1)
    runtime.init(settings.horovod_env(config))   # hvdtrain's start, so the Trainer finds Horovod as it left it
    torch.set_num_threads(1)
    rounds = []
    for number in range(args.rounds):
        order = ["hvdtrain", "hand"] if number % 2 == 0 else ["hand", "hvdtrain"]
        rounds.append(one_round(order, args, config, hvd))
        print(f"round {number}: hvdtrain {rounds[-1]['hvdtrain']:.3f} ms  hand {rounds[-1]['hand']:.3f} ms", flush=True)
    ours = statistics.median(r["hvdtrain"] for r in rounds)
    hand = statistics.median(r["hand"] for r in rounds)
    summary = {"model": args.model, "rounds": rounds, "steps": args.steps, "smoke": args.smoke,
               "hvdtrain_ms": ours, "hand_ms": hand, "ratio_hand_over_hvdtrain": hand / ours,
               "overhead_us": (ours - hand) * 1e3,
               "paired_overhead_us": statistics.median((r["hvdtrain"] - r["hand"]) * 1e3 for r in rounds)}
    print(f"SUMMARY {args.model}: hvdtrain {ours:.3f} ms, hand loop {hand:.3f} ms (medians of {args.rounds} "
          f"round medians); hand/hvdtrain {summary['ratio_hand_over_hvdtrain']:.3f}; the trainer's cost "
          f"{summary['paired_overhead_us']:.0f} us a step (median of paired differences)", flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"overhead_{args.model}.json").write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
