"""`hvdtrain doctor`: what is installed, what Horovod was built with, and what to fix."""
from __future__ import annotations

import importlib.util
import json
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

from hvdtrain.cli.args import Commands, Parser, command_parser
from hvdtrain.cli.gpu_verdicts import gpu_facts, gpu_problems
from hvdtrain.errors import UserError

MPIRUN_TIMEOUT_S = 10.0
FIX = "re-run `make setup` (or scripts/install-horovod --force)"


def _horovod_metadata() -> tuple[str | None, dict[str, Any]]:
    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return None, {}
    root = Path(next(iter(spec.submodule_search_locations)))
    version = None
    init = root / "__init__.py"
    if init.exists():
        for line in init.read_text().splitlines():
            if line.startswith("__version__"):
                version = line.split("=", 1)[1].strip().strip("'\"")
    meta_file = root / "metadata.json"
    meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
    return version or "unknown", meta


def mpirun_version(mpirun: str, timeout: float = MPIRUN_TIMEOUT_S) -> str:
    """The first line of `mpirun --version`; a broken MPI that hangs is reported, not waited on."""
    try:
        proc = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"no answer from {mpirun} --version within {timeout:g} s (a broken MPI install?)"
    except OSError as err:
        return f"cannot run {mpirun}: {err.strerror or err}"
    return (proc.stdout.strip().splitlines() or ["unknown"])[0]


def collect() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }
    info.update(gpu_facts())
    info["horovod"], meta = _horovod_metadata()
    info["horovod_built_against_torch"] = meta.get("pytorch")
    mpirun = shutil.which("mpirun")
    info["mpirun"] = None
    if mpirun:
        info["mpirun"] = mpirun_version(mpirun)
    info["extension_error"] = None
    info["built"] = {}
    if info["horovod"]:
        from hvdtrain.distributed import runtime

        if runtime.hvd is None:
            info["extension_error"] = str(runtime.IMPORT_ERROR)
        else:
            info["built"] = runtime.built_info()
    return info


def diagnose(info: dict[str, Any]) -> list[str]:
    """Problems, each one line naming the fix. Empty means ready."""
    if not info["horovod"]:
        return [f"Horovod is not installed; {FIX}"]
    built_against = info["horovod_built_against_torch"]
    if built_against and built_against != info["torch"]:
        return [f"Horovod was built against torch {built_against} but torch {info['torch']} is "
                f"installed; rebuild it: {FIX}"]
    if info["extension_error"] or not built_against:
        detail = info["extension_error"] or "no PyTorch entry in horovod/metadata.json"
        return [f"Horovod's PyTorch extension is missing or broken ({detail}); {FIX}"]
    if not (info["built"].get("mpi") or info["built"].get("gloo")):
        return [f"Horovod has neither MPI nor Gloo built in; {FIX}"]
    return gpu_problems(info)


def report(info: dict[str, Any]) -> str:
    built = info["built"]
    ops = [name.upper() if name != "gloo" else "Gloo" for name in ("nccl", "mpi", "gloo") if built.get(name)]
    controllers = [name for name, key in (("MPI", "mpi"), ("Gloo", "gloo")) if built.get(key)]
    rows = [
        ("python", info["python"]),
        ("torch", info["torch"] + (f" (CUDA {info['cuda']})" if info["cuda"] else " (CPU)")),
        ("horovod", info["horovod"] or "not installed"),
        ("built against torch", info["horovod_built_against_torch"] or "-"),
        ("controllers", ", ".join(controllers) or "-"),
        ("tensor ops", ", ".join(ops) or "-"),
        ("mpirun", info["mpirun"] or "not found"),
        ("visible GPUs", str(info["gpus"])),
        ("nvidia-smi", f"{info.get('smi_gpus')} GPU(s), driver {info.get('driver')}" if info.get("driver") else "-"),
        ("nvcc", info.get("nvcc") or "-"),
    ]
    return "\n".join(f"{key:>20}: {value}" for key, value in rows)


def parser(commands: Commands | None = None) -> Parser:
    p = command_parser(commands, "doctor", __doc__)
    p.add_argument("--gpu", action="store_true",
                   help="run every GPU path once and print a table (needs CUDA GPUs; `make gpu-check`)")
    p.add_argument("--probe", action="store_true",
                   help="measure each --hosts host's link over ssh before training and name a slow one")
    p.add_argument("--hosts", metavar="A,B", help="hosts to probe, as for horovodrun -H (node1:2,node2:2)")
    p.add_argument("-p", "--ssh-port", type=int, help="ssh port of the hosts (as horovodrun -p)")
    p.add_argument("-i", "--ssh-identity-file", metavar="KEY", help="ssh private key (as horovodrun -i)")
    return p


def main(args: list[str] | None = None) -> int:
    options = parser().parse_args(args or [])
    if options.gpu:
        from hvdtrain.cli import gpu_check

        return gpu_check.main()
    if options.probe or options.hosts:
        from hvdtrain.cli import link_probe

        if not (options.probe and options.hosts):
            raise UserError("doctor: --probe and --hosts go together, e.g. hvdtrain doctor --probe --hosts "
                            "node1,node2 (-p PORT -i KEY as for horovodrun)")
        return link_probe.main(options.hosts, options.ssh_port, options.ssh_identity_file)
    info = collect()
    print(report(info))
    problems = diagnose(info)
    for problem in problems:
        print(f"hvdtrain: error: {problem}")
    if not problems:
        print("hvdtrain: ready")
    return 1 if problems else 0
