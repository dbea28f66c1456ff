"""`hvdtrain doctor --gpu` (`make gpu-check`): every GPU path once, on a machine with GPUs and a CUDA torch.

Runs, each as its own process with a time limit, and prints one table row per path: doctor (NCCL built
in), one rank in fp32 / bf16 / fp16, on all local GPUs (NCCL): SyncBN on a ResNet-18 (BatchNorm), data
parallel, fp16 gradients on the wire, the fp16 loss scaler with an allreduce; hybrid stages (plain and with
SyncBN) where >= 2 GPUs; more ranks than GPUs refused in one line; compress prune and distill on GPU;
predict; and, in a checkout, the np=1 benchmark against the plain loop. Stops at the first failure with one
line and a non-zero exit. Without a CUDA device it exits at once, naming a driver too old for torch's CUDA.
None of these paths has run on a GPU in this project yet: this command is how the first GPU user checks.
"""
from __future__ import annotations

import importlib.util
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


# A step that must fail, and the text its last error line must hold (the refusal, not some other crash).
TOO_MANY = "workers on this host but"


def gpu_steps(gpus: int, run_dir: Path, benchmarks: bool = True) -> list[tuple[str, list[str]]]:
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
    steps += [(f"SyncBN resnet18 (BatchNorm), {gpus} GPU(s)", job(gpus, "syncbn", "--sync-bn", "true", "--model",
                                                                  "resnet18")),
              (f"data parallel, {gpus} GPU(s) (NCCL)", job(gpus, "dp")),
              (f"fp16 gradients on the wire, {gpus} GPU(s)", job(gpus, "fp16wire", "--compression", "fp16")),
              (f"fp16 loss scaler + allreduce, {gpus} GPU(s)", job(gpus, "scaler", "--precision", "fp16"))]
    if gpus >= 2:
        steps.append((f"hybrid --stages 2, {gpus // 2} worker(s)", job(gpus // 2, "hybrid", "--model", "mlp",
                                                                         "--stages", "2", "--micro-batches", "2")))
        steps.append((f"hybrid --stages 2 + SyncBN, {gpus // 2} worker(s)",
                      job(gpus // 2, "hybrid-syncbn", "--model", "resnet18", "--stages", "2", "--sync-bn", "true")))
    steps.append((f"{gpus + 1} ranks on {gpus} GPU(s) refused", job(gpus + 1, "too-many")))
    source = str(run_dir / "fp32")
    steps += [("compress prune on GPU", [*hvd, "compress", source, "--method", "prune", "--epochs", "1"]),
              ("compress distill on GPU", [*hvd, "compress", source, "--method", "distill", "--epochs", "1",
                                           "--baseline", "false"]),
              ("predict", [*hvd, "predict", "--checkpoint", str(run_dir / "fp32" / "model.pt"),
                           "--out", str(run_dir / "predictions.pt")])]
    if benchmarks:
        steps.append(("benchmark np=1 vs plain loop", [py, "-m", "benchmarks.run", "--smoke", "--nps", "1",
                                                       "--device", "cuda", "--out", str(run_dir / "bench")]))
    return steps


def expected_error(name: str) -> str | None:
    """The refusal a step must end in, or None for a step that must succeed."""
    return TOO_MANY if name.endswith("refused") else None


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print(no_device_message(torch.__version__, torch.version.cuda, gpu_facts()), file=sys.stderr)
        return 1
    run_dir = Path(tempfile.mkdtemp(prefix="hvdtrain-gpu-check-"))
    print(f"{'path':<40} {'result':<8} seconds")
    # benchmarks/ is the repository's, not the package's: an image or a pip install has none to run.
    benchmarks = importlib.util.find_spec("benchmarks") is not None
    if not benchmarks:
        print(f"{'benchmark np=1 vs plain loop':<40} {'skipped':<8} (no benchmarks/ beside this install)")
    for name, command in gpu_steps(torch.cuda.device_count(), run_dir, benchmarks):
        start = time.monotonic()
        refusal = expected_error(name)
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
            detail = (proc.stderr or proc.stdout).strip().splitlines() or ["?"]
            ok = proc.returncode == 0 if refusal is None else (proc.returncode != 0 and any(
                refusal in line for line in detail))
            detail = detail[-1:] if refusal is None or ok else [f"expected a refusal naming '{refusal}', got "
                                                                f"exit {proc.returncode}: {detail[-1]}"]
        except subprocess.TimeoutExpired:
            ok, detail = False, [f"no end within {STEP_TIMEOUT_S} s"]
        print(f"{name:<40} {'ok' if ok else 'FAILED':<8} {time.monotonic() - start:.0f}", flush=True)
        if not ok:
            print(f"hvdtrain: error: GPU check '{name}' failed: {detail[0]} (outputs in {run_dir})", file=sys.stderr)
            return 1
    shutil.rmtree(run_dir, ignore_errors=True)
    print("hvdtrain: every GPU path ran")
    return 0
