"""hvdtrain benchmarks: one command, variants side by side, alternating A B A B to cancel drift.

    python -m benchmarks.run                 # full size (minutes); results in bench-results/
    python -m benchmarks.run --smoke         # tiny sizes, end to end (CI): checks the harness, not speed

Each (model, np) group runs every variant once per round, in the same order, for --rounds rounds;
a variant's best-of-N and median pool its step times over all rounds. Outputs: a table on stdout
and in results.md, results.json, results.png. See benchmarks/README.md for what the numbers mean.

A full run (not --smoke, no failed variant) whose --out is a folder directly in benchmarks/results/
becomes the newest figures: benchmarks/results/latest (a one-line text file) then holds its folder
name; `latest_run()` reads it.

This module is the entry point: the variants, the options, the rounds, the latest pointer. Launching
and summarising one job is benchmarks/harness.py; ratios, table and chart are benchmarks/report.py;
--hosts hands the parsed options to benchmarks/network.py (which imports nothing from here).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import BIN, ROOT, git_head, launch, summarise
from benchmarks.harness import run_job as run_job  # re-exported: tests/multirank/test_benchmarks.py imports it here
from benchmarks.report import chart, ratios, table

RESULTS = ROOT / "benchmarks" / "results"
LATEST = "latest"  # in RESULTS: a text file holding the newest full run's folder name


def variants(np: int, backends: list[str], light: bool = False) -> list[dict[str, Any]]:
    """What runs in one (model, np) group: name, worker variant, launcher, Horovod backend.

    light (the smoke run's extra models): each code path of the workload once, hvdtrain and the two
    loops it is compared with at np=2, hvdtrain alone at np=1."""
    if light:
        backend = backends[0]
        if np == 1:
            return [{"name": "hvdtrain", "variant": "hvdtrain", "launcher": "python"}]
        return [{"name": "ddp", "variant": "ddp", "launcher": "torchrun"},
                {"name": f"hvdtrain-{backend}", "variant": "hvdtrain", "launcher": "horovodrun", "backend": backend},
                {"name": f"horovod-{backend}", "variant": "horovod", "launcher": "horovodrun", "backend": backend}]
    if np == 1:
        # One process: Horovod's size-1 path, torch's plain loop and DDP's one-process overhead.
        return [{"name": "single", "variant": "single", "launcher": "python"},
                {"name": "hvdtrain", "variant": "hvdtrain", "launcher": "python"},
                {"name": "horovod", "variant": "horovod", "launcher": "python"},
                {"name": "ddp", "variant": "ddp", "launcher": "torchrun"}]
    rows = [{"name": "ddp", "variant": "ddp", "launcher": "torchrun"},
            {"name": "compute", "variant": "compute", "launcher": "horovodrun", "backend": backends[0]}]
    for backend in backends:
        rows += [{"name": f"hvdtrain-{backend}", "variant": "hvdtrain", "launcher": "horovodrun", "backend": backend},
                 {"name": f"horovod-{backend}", "variant": "horovod", "launcher": "horovodrun", "backend": backend},
                 {"name": f"allreduce-{backend}", "variant": "allreduce", "launcher": "horovodrun",
                  "backend": backend}]
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny models and sizes: checks the harness")
    parser.add_argument("--out", default="bench-results", help="folder for results.json/.md/.png")
    parser.add_argument("--models", default="mlp,cnn,resnet18,transformer")
    parser.add_argument("--nps", default="1,2", help="worker counts, e.g. 1,2")
    parser.add_argument("--backends", default="gloo,mpi", help="Horovod backends at np>1 (horovodrun --gloo/--mpi)")
    parser.add_argument("--rounds", type=int, default=2, help="A B A B rounds per group")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run")
    parser.add_argument("--model-steps", default="", metavar="MODEL=N,...",
                        help="timed steps per run for some models instead of --steps, e.g. resnet18=15 "
                             "(its step is 3-5x the others': keeps a full run affordable)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--no-pin", dest="pin", action="store_false", help="do not pin one core per rank")
    parser.add_argument("--bandwidth", default="horovod-gloo,horovod-mpi,torch-gloo,memcpy",
                        help="allreduce sweep implementations; empty to skip")
    parser.add_argument("--sizes", default="1,4,16,64", help="sweep message sizes in MB")
    parser.add_argument("--iters", type=int, default=5, help="timed allreduces per size")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="extra environment for every worker, e.g. HOROVOD_CYCLE_TIME=5")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per launched job")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="cuda: one GPU per rank by local rank, DDP and the torch sweep on NCCL (untested here)")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                        help="autocast for every training variant (fp16: CUDA only, with a GradScaler)")
    parser.add_argument("--hosts", default="", metavar="N[,N...]",
                        help="network mode (benchmarks/network.py): N network-namespace hosts, one rank each, "
                             "every link limited to --link by tc tbf (root); e.g. 2,3")
    parser.add_argument("--link", default="1gbit", help="with --hosts: each host's link rate, tc syntax (1gbit)")
    parser.add_argument("--only", default="", metavar="NAME,...",
                        help="with --hosts: run only these variants, e.g. hvdtrain-mpi,horovod-mpi")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE[,KEY=VALUE]",
                        help="with --hosts: one more hvdtrain variant on the first backend with this environment, "
                             "alternated with the others, e.g. before:HVDTRAIN_SCALE_FIRST=0")
    args = parser.parse_args(argv)
    if args.hosts and args.smoke:
        # network smoke (CI): the tiny MLP, hvdtrain-gloo and DDP over 2 hosts, one round
        args.steps, args.warmup, args.models, args.backends = 4, 1, "mlp", "gloo"
    elif args.smoke:
        # Every launcher and code path once, as small as possible: the MLP with every variant (Gloo
        # only, two rounds of the cheap np=1 group, one at np=2: each horovodrun start costs seconds),
        # then the real-size workloads at toy sizes, light variant sets (see variants()).
        args.steps, args.warmup, args.sizes, args.iters = 3, 1, "0.25,1", 2
        args.backends = "gloo"
        if args.models == parser.get_default("models"):   # an explicit --models (a shorter smoke) is kept
            args.models = "mlp,resnet18,transformer"
        args.bandwidth = "horovod-gloo,torch-gloo,memcpy"
    return args


def is_full(result: dict[str, Any]) -> bool:
    """A run that may stand as the newest figures: not a smoke run, and no variant failed."""
    return not result["meta"]["smoke"] and not any(
        row.get("failed") for rows in result["groups"].values() for row in rows.values())


def update_latest(out: Path, result: dict[str, Any], root: Path = RESULTS) -> bool:
    """Point root/latest at `out` if it is a full run saved directly in `root`. Returns whether it did.

    The pointer is a text file (the folder name and a newline), written atomically: portable where
    symlinks are not (Windows checkouts, some CI artifact stores), and readable by any script."""
    if not is_full(result) or out.resolve().parent != root.resolve():
        return False
    tmp = root / f".{LATEST}.tmp"
    tmp.write_text(out.resolve().name + "\n")
    tmp.replace(root / LATEST)
    return True


def latest_run(root: Path = RESULTS) -> Path | None:
    """The newest full run's folder (holding results.json), or None if there is no valid pointer."""
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    name = pointer.read_text().strip()
    folder = root / name
    if not name or "/" in name or name in (".", "..") or not (folder / "results.json").is_file():
        return None
    return folder


def run(args: argparse.Namespace, partial: Path | None = None) -> dict[str, Any]:
    """All groups, then the sweep. After each group the results so far go to `partial` (if given),
    so a run cut short still leaves its finished groups behind."""
    models = [m for m in args.models.split(",") if m]
    nps = [int(n) for n in args.nps.split(",") if n]
    backends = [b for b in args.backends.split(",") if b]
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(args.threads)}
    # No HOROVOD_THREAD_AFFINITY: communication threads (Horovod's background thread, DDP's gloo
    # threads) are started in init, before the worker pins its rank, so both keep the process's
    # first affinity alike, as in a real hvdtrain run, which pins nothing. (Pinning Horovod's thread
    # to its rank's core, as earlier runs did, handicapped Horovod against DDP.)
    env.update(kv.split("=", 1) for kv in args.env)
    model_steps = {model: int(n) for model, _, n in (kv.partition("=") for kv in args.model_steps.split(",") if kv)}
    worker_args = ["--warmup", str(args.warmup), "--threads", str(args.threads),
                   "--device", args.device, "--precision", args.precision]
    worker_args += ["--pin"] if args.pin else []
    worker_args += ["--smoke"] if args.smoke else []
    meta = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "cpus": os.cpu_count(),
            "loadavg_before": [round(x, 2) for x in os.getloadavg()], "python": platform.python_version(),
            "rounds": args.rounds, "steps": args.steps, "model_steps": model_steps, "warmup": args.warmup,
            "threads": args.threads,
            "pin": args.pin, "smoke": args.smoke, "env": env, "argv": sys.argv[1:], "device": args.device,
            "precision": args.precision, "git": git_head()}
    try:
        import horovod
        import torch

        meta.update(torch=torch.__version__, horovod=horovod.__version__)
    except ImportError:
        pass

    groups: dict[str, dict[str, dict[str, Any]]] = {}
    for index, model in enumerate(models):
        for np in nps:
            group = f"{model}/np{np}"
            specs = variants(np, backends, light=args.smoke and index > 0)
            records: dict[str, list[dict[str, Any]]] = {s["name"]: [] for s in specs}
            rounds = 1 if args.smoke and (np > 1 or index > 0) else args.rounds  # smoke: the MLP alternates
            for round_no in range(rounds):
                order = specs if round_no % 2 == 0 else specs[::-1]  # A B C, C B A: no variant always first
                for spec in order:
                    steps = model_steps.get(model, args.steps)
                    rec = launch(spec, np, [*worker_args, "--steps", str(steps), "--model", model], env, args.timeout)
                    records[spec["name"]].append(rec)
                    shown = f"{rec['best_ms']:.1f} ms best" if "best_ms" in rec else rec["error"]
                    print(f"[bench] {group} round {round_no + 1} {spec['name']}: {shown}", flush=True)
            groups[group] = {s["name"]: summarise(s["name"], s, records[s["name"]]) for s in specs}
            if partial:
                partial.write_text(json.dumps({"meta": meta, "groups": groups}, indent=1))

    bandwidth: dict[str, list[dict[str, Any]]] = {}
    bw_np = max(max(nps), 2)
    for impl in [b for b in args.bandwidth.split(",") if b]:
        kind, _, backend = impl.partition("-")
        spec = {"variant": f"bw-{kind}", "launcher": {"horovod": "horovodrun", "torch": "torchrun"}.get(kind, "python"),
                "backend": backend}
        rec = launch(spec, bw_np if kind != "memcpy" else 1,
                     ["--sizes", args.sizes, "--iters", str(args.iters), "--threads", str(args.threads),
                      "--device", args.device, *(["--pin"] if args.pin else [])], env, args.timeout)
        print(f"[bench] bandwidth {impl}: {'ok' if 'rows' in rec else rec['error']}", flush=True)
        bandwidth[impl] = rec.get("rows", [])
        if "rows" not in rec:
            meta.setdefault("errors", {})[impl] = rec.get("output_tail", "")

    meta.update(loadavg_after=[round(x, 2) for x in os.getloadavg()], bandwidth_np=bw_np,
                bandwidth_iters=args.iters)
    return {"meta": meta, "groups": groups, "ratios": ratios(groups, backends), "bandwidth": bandwidth}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("horovodrun", path=str(BIN)) is None:
        print("benchmarks: horovodrun is not in this Python's bin folder; run `make setup` first", file=sys.stderr)
        return 2
    if args.hosts:
        from benchmarks.network import main_network

        return main_network(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = run(args, partial=out / "results.partial.json")
    (out / "results.partial.json").unlink(missing_ok=True)
    text = table(result)
    (out / "results.json").write_text(json.dumps(result, indent=1))
    (out / "results.md").write_text("```\n" + text + "\n```\n")
    chart(result, out / "results.png")
    print(text)
    print(f"\nwrote {out / 'results.json'}, {out / 'results.md'}, {out / 'results.png'}")
    if update_latest(out, result):
        print(f"{RESULTS.relative_to(ROOT) / LATEST} -> {out.resolve().name}")
    failed = [f"{g} {r['name']}" for g, rows in result["groups"].items() for r in rows.values() if r.get("failed")]
    if failed:
        print(f"benchmarks: {len(failed)} variant(s) had failed runs: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
