"""`hvdtrain doctor --gpu` (`make gpu-check`): every GPU path once, on a machine with GPUs and a CUDA torch.

Runs, each as its own process with a time limit, and prints one table row per path: doctor (NCCL built
in), one rank in fp32 / bf16 / fp16, SyncBN and data parallel on all local GPUs (NCCL), hybrid stages
where >= 2 GPUs, compress prune on GPU, predict, and the np=1 benchmark against the plain loop. Stops
at the first failure with one line and a non-zero exit. Without a CUDA device it exits at once.
None of these paths has run on a GPU in this project yet: this command is how the first GPU user checks.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hvdtrain.cli.gpu_verdicts import gpu_facts, no_device_message

STEP_TIMEOUT_S = 150
SMALL = ["--dataset", "synthetic", "--synthetic-samples", "512", "--synthetic-shape", "1,8,8", "--model", "cnn",
         "--epochs", "1", "--max-steps", "8", "--log-interval", "4", "--device", "cuda"]


def gpu_steps(gpus: int, run_dir: Path) -> list[tuple[str, list[str]]]:
    """(name, command) for every GPU path this machine can run; hybrid stages only with >= 2 GPUs.

    Example:
        >>> [name for name, _ in gpu_steps(1, Path("r"))][:3]
        ['doctor (NCCL)', 'one rank fp32', 'one rank bf16']
    """
    py, hvd = sys.executable, [sys.executable, "-m", "hvdtrain"]
    horovodrun = str(Path(py).parent / "horovodrun") if (Path(py).parent / "horovodrun").exists() else "horovodrun"

    def job(np: int, name: str, *extra: str) -> list[str]:
        launch = [horovodrun, "-np", str(np), "-H", f"localhost:{np}", "--start-timeout", "60", py] if np > 1 else [py]
        return [*launch, "-m", "hvdtrain", *SMALL, "--run-dir", str(run_dir), "--name", name, *extra]

    steps = [("doctor (NCCL)", [*hvd, "doctor"])]
    steps += [(f"one rank {p}", job(1, p, "--precision", p)) for p in ("fp32", "bf16", "fp16")]
    steps += [(f"SyncBN, {gpus} GPU(s)", job(gpus, "syncbn", "--sync-bn", "true")),
              (f"data parallel, {gpus} GPU(s) (NCCL)", job(gpus, "dp"))]
    if gpus >= 2:
        steps.append((f"hybrid --stages 2, {gpus // 2} worker(s)", job(gpus // 2, "hybrid", "--model", "mlp",
                                                                         "--stages", "2", "--micro-batches", "2")))
    prune = [*hvd, "compress", str(run_dir / "fp32"), "--method", "prune", "--epochs", "1"]
    steps += [("compress prune on GPU", prune),
              ("predict", [*hvd, "predict", "--checkpoint", str(run_dir / "fp32" / "model.pt"),
                           "--out", str(run_dir / "predictions.pt")]),
              ("benchmark np=1 vs plain loop", [py, "-m", "benchmarks.run", "--smoke", "--nps", "1", "--device",
                                                "cuda", "--out", str(run_dir / "bench")])]
    return steps


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print(no_device_message(torch.__version__, torch.version.cuda, gpu_facts()), file=sys.stderr)
        return 1
    run_dir = Path(tempfile.mkdtemp(prefix="hvdtrain-gpu-check-"))
    print(f"{'path':<40} {'result':<8} seconds")
    for name, command in gpu_steps(torch.cuda.device_count(), run_dir):
        start = time.monotonic()
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
            ok, detail = proc.returncode == 0, (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
        except subprocess.TimeoutExpired:
            ok, detail = False, [f"no end within {STEP_TIMEOUT_S} s"]
        print(f"{name:<40} {'ok' if ok else 'FAILED':<8} {time.monotonic() - start:.0f}", flush=True)
        if not ok:
            print(f"hvdtrain: error: GPU check '{name}' failed: {detail[0]} (outputs in {run_dir})", file=sys.stderr)
            return 1
    shutil.rmtree(run_dir, ignore_errors=True)
    print("hvdtrain: every GPU path ran")
    return 0
