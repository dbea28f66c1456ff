"""What to build: the pure part of scripts/install_horovod.py (no subprocess, no file written).

Standard library only, so it runs before hvdtrain itself is installed. Decides the wheel cache key (Horovod, torch,
Python, CUDA, architectures and the digest of the patch series), names the patches of the series, reads
`horovodrun --check-build` and says in one line what is missing. The toolchain (install_toolchain.py) finds
compilers, CUDA and NCCL; the build (install_build.py) applies the series, compiles, installs and verifies.
"""
from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

HOROVOD_VERSION = "0.28.1"
# The sdist the patch series is written against (PyPI's horovod-0.28.1.tar.gz): a download or cached copy with
# other bytes is refused before anything is patched.
SDIST_SHA256 = "92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0"
EXPECTED_BUILD = ("PyTorch", "MPI", "Gloo")
# hvdtrain's patches to Horovod: real unified diffs, applied in the order of patches/series.
PATCH_DIR = Path(__file__).resolve().parent / "patches"
# Names the patched build carries, which an installed Horovod is checked for (install_build.installed_matches):
BF16_BINDING = "horovod_torch_allreduce_async_torch_BFloat16Tensor"   # 0007: the seam's bfloat16 binding
IDLE_ENV = "HOROVOD_IDLE_CYCLE_TIME"                                  # 0008: idle ranks wait for work
EXCHANGE_ENV = "HOROVOD_EXCHANGE_ALLREDUCE"                           # 0009: 2-rank sums as one exchange
# command -> Debian package that provides it
SYSTEM_TOOLS = {"mpicxx": "libopenmpi-dev", "mpirun": "openmpi-bin", "cmake": "cmake", "g++": "g++", "patch": "patch"}
# Needed only by tests (the two-host test runs a real sshd per host, the Slurm test a real slurmctld, slurmd
# and munged); their absence never stops a build.
TEST_TOOLS = {"/usr/sbin/sshd": "openssh-server", "/usr/sbin/slurmctld": "slurm-wlm", "/usr/sbin/slurmd": "slurm-wlm",
              "/usr/bin/srun": "slurm-wlm", "/usr/sbin/munged": "munge"}
NCCL_MISSING = ("NCCL (nccl.h and libnccl.so under HOROVOD_NCCL_HOME, NCCL_HOME, CUDA_HOME, /usr, /usr/local/cuda "
                "or torch's nvidia-nccl wheel: install libnccl-dev, or set HVDTRAIN_ALLOW_NO_NCCL=1 to build "
                "without it, sending GPU tensors through host memory)")


class InstallError(Exception):
    """A failure the user can act on; main() prints it as one line."""


def parse_version(text: str) -> tuple[int, ...]:
    """'2.13.0+cpu' -> (2, 13, 0); '2.1.0a0+git' -> (2, 1, 0)."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if not match:
        raise InstallError(f"cannot parse version {text!r}")
    return tuple(int(part or 0) for part in match.groups())


def needs_cxx17(torch_version: str) -> bool:
    """Whether patch 0005's C++17 block applies (torch >= 2.1), so the build is told torch's own standard."""
    return parse_version(torch_version) >= (2, 1, 0)


def cxx_standard_of(header_text: str) -> int:
    """The C++ standard torch's umbrella header (torch/all.h) demands: its `#error C++NN or later` line.

    Example:
        >>> cxx_standard_of("#error C++20 or later compatible compiler is required."), cxx_standard_of("")
        (20, 17)
    """
    found = re.search(r"#error C\+\+(\d\d) or later", header_text)
    return max(17, int(found.group(1))) if found else 17


def series(patch_dir: Path = PATCH_DIR) -> list[Path]:
    """The patch files of `series`, in order (blank lines and # comments skipped)."""
    names = [line.strip() for line in (patch_dir / "series").read_text().splitlines()]
    return [patch_dir / name for name in names if name and not name.startswith("#")]


def series_hash(patch_dir: Path = PATCH_DIR) -> str:
    """A digest of what the series changes (each patch's diff, in order; not its header, which only explains):
    the patch part of the wheel cache key, and the stamp an installed Horovod must carry."""
    digest = hashlib.sha256()
    for path in series(patch_dir):
        digest.update(path.read_bytes().split(b"\n---\n", 1)[-1] + b"\0")
    return digest.hexdigest()[:10]


PATCH_SET_HASH = series_hash()


def cache_key(horovod: str, torch: str, python: str, cuda: str | None, nccl: bool, cc_list: str = "",
              torch_cuda: str | None = None, patches: str | None = None) -> str:
    """One folder per build configuration; a wheel is reused only for an identical one.

    `cuda` is the CUDA of the GPU build (None: a CPU build); `torch_cuda` is torch's own CUDA when that
    differs (a CUDA torch with Horovod built for CPU on a GPU-less machine), so the two never share a wheel.
    `cc_list` is HOROVOD_BUILD_CUDA_CC_LIST (the GPU architectures compiled); '' = all nvcc knows.
    `patches` is the digest of the patch series (default: this checkout's), so a wheel built before a patch
    changed, or before it existed, is never reused.
    """
    accel = f"cu{cuda}" + ("-nccl" if nccl else "") if cuda else (f"cpu-on-cu{torch_cuda}" if torch_cuda else "cpu")
    if cuda and cc_list.strip():
        accel += "-cc" + "_".join(sorted({cc.strip() for cc in cc_list.split(",") if cc.strip()}, key=int))
    safe_torch = re.sub(r"[^0-9A-Za-z.]+", "_", torch)
    return f"horovod-{horovod}-torch{safe_torch}-py{python}-{accel}-p{patches or PATCH_SET_HASH}"


def parse_check_build(output: str) -> dict[str, bool]:
    """`horovodrun --check-build` lines like '[X] PyTorch' -> {'PyTorch': True}.

    Controllers and tensor ops both list MPI and Gloo; a name counts as built only if every
    line naming it is checked.
    """
    found: dict[str, bool] = {}
    for mark, name in re.findall(r"\[([ X])\]\s+(\w+)", output):
        found[name] = found.get(name, True) and mark == "X"
    return found


def expected_build(cuda: str | None, nccl: bool) -> tuple[str, ...]:
    """What `horovodrun --check-build` must show: NCCL too for a CUDA torch built with NCCL."""
    return EXPECTED_BUILD + (("NCCL",) if cuda and nccl else ())


def missing_tools(which=shutil.which, tools: dict[str, str] = SYSTEM_TOOLS) -> list[str]:
    return [tool for tool in tools if which(tool) is None]


def nvcc_wheel(cuda: str) -> str:
    """The PyPI requirement that carries nvcc for torch's CUDA: -cu12 names up to CUDA 12, plain from 13."""
    major, minor = (cuda.split(".") + ["0"])[:2]
    name = "nvidia-cuda-nvcc" if int(major) >= 13 else f"nvidia-cuda-nvcc-cu{major}"
    return f"{name}=={major}.{minor}.*"


def cc_list_of(compute_caps: list[str]) -> str:
    """nvidia-smi's compute capabilities ('9.0', '8.6') -> HOROVOD_BUILD_CUDA_CC_LIST ('86,90')."""
    ccs = {cap.strip().replace(".", "") for cap in compute_caps if re.fullmatch(r"\s*\d+\.\d+\s*", cap)}
    return ",".join(sorted(ccs, key=int))


def gpu_wanted(environ: Mapping[str, str], compute_caps: list[str]) -> bool:
    """Build Horovod's GPU ops? HVDTRAIN_HOROVOD_GPU=1/0 decides (an image built on a machine without a GPU
    says 1); else HOROVOD_GPU_OPERATIONS set, or an NVIDIA GPU on this machine."""
    asked = environ.get("HVDTRAIN_HOROVOD_GPU", "").strip().lower()
    if asked in ("1", "true", "yes", "on"):
        return True
    if asked in ("0", "false", "no", "off"):
        return False
    return bool(environ.get("HOROVOD_GPU_OPERATIONS") or compute_caps)


def cpu_on_cuda_torch_note(cuda: str) -> str:
    return (f"torch is a CUDA {cuda} build but this machine has no NVIDIA GPU: building Horovod for CPU "
            "(HVDTRAIN_HOROVOD_GPU=1 builds the GPU ops anyway, e.g. for an image)")


def gpu_missing_message(cuda: str, missing: list[str]) -> str:
    return (f"torch is a CUDA {cuda} build and this machine has a GPU, but the GPU build of Horovod lacks "
            f"{' and '.join(missing)}; or set HVDTRAIN_HOROVOD_GPU=0 to build Horovod for CPU only")


def nvcc_missing(cuda: str) -> str:
    return f"nvcc (install the CUDA {cuda} toolkit, or `pip install '{nvcc_wheel(cuda)}'`)"
