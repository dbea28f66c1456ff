"""Build, cache, install and verify Horovod 0.28.1 against the installed torch.

Run with the Python of the environment that should receive Horovod:

    .venv/bin/python scripts/install_horovod.py        # or scripts/install-horovod

Standard library only, so it runs before hvdtrain itself is installed (Docker images use the same
file). Horovod 0.28.1 does not compile against torch >= 2.1 as released: torch's headers need C++17
while Horovod's torch extension asks for C++14, and linking a C++17 extension against the bundled
gloo compiled as C++11 fails with duplicate `kDefaultTimeout` symbols. `apply_cxx17_fix` compiles
the extension as C++17 and links it against a C++17 copy of gloo (the block Horovod already has for
TensorFlow), which is what upstream master did after the last release. `apply_gcc13_fix` adds the
standard includes g++ 13 (Ubuntu 24.04, the GPU image's base) needs in two of its headers.
`apply_bf16` adds bfloat16 as a Horovod data type (scripts/horovod_bf16.py); `apply_perf` lets idle ranks skip
Horovod's per-cycle negotiation and allreduces without copies or Gloo's ring where it can
(scripts/horovod_perf.py: HOROVOD_IDLE_CYCLE_TIME, HOROVOD_EXCHANGE_ALLREDUCE). `apply_series` applies the patches
listed in scripts/horovod/patches/series (real unified diffs, each with a header saying why) with
`patch -p1 --forward --fuzz=0`.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from horovod_bf16 import BF16_BINDING, BF16_MARKER, BF16_PATCHES, patch_set_hash
from horovod_perf import EXCHANGE_ENV, IDLE_ENV, PERF_MARKER, PERF_PATCHES

HOROVOD_VERSION = "0.28.1"
CXX17_MARKER = "# hvdtrain: C++17 fix for torch >= 2.1"
EXPECTED_BUILD = ("PyTorch", "MPI", "Gloo")
# command -> Debian package that provides it
SYSTEM_TOOLS = {"mpicxx": "libopenmpi-dev", "mpirun": "openmpi-bin", "cmake": "cmake", "g++": "g++", "patch": "patch"}
# Needed only by tests (the two-host test runs a real sshd per host, the Slurm test a real slurmctld, slurmd
# and munged); their absence never stops a build.
TEST_TOOLS = {"/usr/sbin/sshd": "openssh-server", "/usr/sbin/slurmctld": "slurm-wlm", "/usr/sbin/slurmd": "slurm-wlm",
              "/usr/bin/srun": "slurm-wlm", "/usr/sbin/munged": "munge"}


class InstallError(Exception):
    """A failure the user can act on; main() prints it as one line."""


# ---------------------------------------------------------------- pure parts (unit tested)

def parse_version(text: str) -> tuple[int, ...]:
    """'2.13.0+cpu' -> (2, 13, 0); '2.1.0a0+git' -> (2, 1, 0)."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if not match:
        raise InstallError(f"cannot parse version {text!r}")
    return tuple(int(part or 0) for part in match.groups())


def needs_cxx17(torch_version: str) -> bool:
    return parse_version(torch_version) >= (2, 1, 0)


def cxx_standard_of(header_text: str) -> int:
    """The C++ standard torch's umbrella header (torch/all.h) demands: its `#error C++NN or later` line.

    Example:
        >>> cxx_standard_of("#error C++20 or later compatible compiler is required."), cxx_standard_of("")
        (20, 17)
    """
    found = re.search(r"#error C\+\+(\d\d) or later", header_text)
    return max(17, int(found.group(1))) if found else 17


def torch_cxx_standard(python: str) -> int:
    code = ("import os, torch; print(open(os.path.join(os.path.dirname(torch.__file__), 'include', 'torch', 'csrc', "
            "'api', 'include', 'torch', 'all.h')).read())")
    proc = run([python, "-c", code])
    return cxx_standard_of(proc.stdout) if proc.returncode == 0 else 17


def cache_key(horovod: str, torch: str, python: str, cuda: str | None, nccl: bool, cc_list: str = "",
              torch_cuda: str | None = None, patches: str | None = None) -> str:
    """One folder per build configuration; a wheel is reused only for an identical one.

    `cuda` is the CUDA of the GPU build (None: a CPU build); `torch_cuda` is torch's own CUDA when that
    differs (a CUDA torch with Horovod built for CPU on a GPU-less machine), so the two never share a wheel.
    `cc_list` is HOROVOD_BUILD_CUDA_CC_LIST (the GPU architectures compiled); '' = all nvcc knows.
    `patches` is the digest of hvdtrain's patch set (default: this file's), so a wheel built before a patch
    changed, or before it existed, is never reused.
    """
    accel = f"cu{cuda}" + ("-nccl" if nccl else "") if cuda else (f"cpu-on-cu{torch_cuda}" if torch_cuda else "cpu")
    if cuda and cc_list.strip():
        accel += "-cc" + "_".join(sorted({cc.strip() for cc in cc_list.split(",") if cc.strip()}, key=int))
    safe_torch = re.sub(r"[^0-9A-Za-z.]+", "_", torch)
    return f"horovod-{horovod}-torch{safe_torch}-py{python}-{accel}-p{patches or PATCH_SET_HASH}"


# The standard torch's headers demand (HVDTRAIN_TORCH_CXX_STANDARD, from torch_cxx_standard: 17 up to torch
# 2.14, 20 from 2.15); the bundled gloo stays C++17, which links with a C++20 extension (both have inline variables).
_TORCH_STD = (
    'if(NOT Pytorch_VERSION VERSION_LESS "1.5.0")\n    set(CMAKE_CXX_STANDARD 14)\nendif()',
    f'{CXX17_MARKER}\nif(NOT Pytorch_VERSION VERSION_LESS "2.1.0" AND DEFINED ENV{{HVDTRAIN_TORCH_CXX_STANDARD}})\n'
    '    set(CMAKE_CXX_STANDARD $ENV{HVDTRAIN_TORCH_CXX_STANDARD})\n'
    'elseif(NOT Pytorch_VERSION VERSION_LESS "2.1.0")\n    set(CMAKE_CXX_STANDARD 17)\n'
    'elseif(NOT Pytorch_VERSION VERSION_LESS "1.5.0")\n    set(CMAKE_CXX_STANDARD 14)\nendif()',
)
_TORCH_GLOO = (
    "if(HAVE_GLOO)\n    if (Pytorch_CXX11)\n        list(APPEND PYTORCH_LINKER_LIBS gloo)",
    'if(HAVE_GLOO)\n    if (NOT Pytorch_VERSION VERSION_LESS "2.1.0")\n'
    "        list(APPEND PYTORCH_LINKER_LIBS compatible17_gloo)\n"
    "    elseif (Pytorch_CXX11)\n        list(APPEND PYTORCH_LINKER_LIBS gloo)",
)
# FindPytorch calls torch a CUDA build whenever torch has CUDA and a CUDA toolkit is on the machine (torch's
# CUDA_HOME), GPU or not; the torch extension then links cudart and compiles GPU code. This lets a GPU-less
# machine build the CPU extension against a CUDA torch (CppExtension, no add_cuda()).
_FIND_PYTORCH_CPU_ONLY = (
    'string(TOUPPER "${Pytorch_CUDA}" Pytorch_CUDA)',
    f'string(TOUPPER "${{Pytorch_CUDA}}" Pytorch_CUDA)\n{CXX17_MARKER}: HVDTRAIN_HOROVOD_CPU_ONLY\n'
    'if ("$ENV{HVDTRAIN_HOROVOD_CPU_ONLY}")\n    set(Pytorch_CUDA FALSE)\nendif()',
)
_TORCH_EXPORT = (
    "set(Pytorch_CXX11 ${Pytorch_CXX11} PARENT_SCOPE)",
    "set(Pytorch_CXX11 ${Pytorch_CXX11} PARENT_SCOPE)\n"
    'if(NOT Pytorch_VERSION VERSION_LESS "2.1.0")\n    set(Pytorch_CXX17 TRUE PARENT_SCOPE)\nendif()',
)
_TOP_GLOO17 = (
    "if(HAVE_GLOO AND (DEFINED Tensorflow_CXX17 AND Tensorflow_CXX17))",
    f"{CXX17_MARKER}\nif(HAVE_GLOO AND ((DEFINED Tensorflow_CXX17 AND Tensorflow_CXX17) OR "
    "(DEFINED Pytorch_CXX17 AND Pytorch_CXX17)))",
)
_TOP_ABI = (
    "    if (Tensorflow_CXX11)\n        target_compile_definitions(compatible17_gloo",
    "    if (Tensorflow_CXX11 OR (NOT DEFINED Tensorflow_CXX11 AND Pytorch_CXX11))\n"
    "        target_compile_definitions(compatible17_gloo",
)
# The C++11 gloo is built only where a target links it (torch < 2.1, TensorFlow or MXNet): with torch >= 2.1 alone
# nothing does (the extension links compatible17_gloo), and its 38 objects were a third of a fresh compile.
_TOP_GLOO_ON_DEMAND = (
    "    add_subdirectory(third_party/gloo)\n",
    "    add_subdirectory(third_party/gloo EXCLUDE_FROM_ALL)\n",
)
PATCHES = {
    "horovod/torch/CMakeLists.txt": (_TORCH_STD, _TORCH_GLOO, _TORCH_EXPORT),
    "cmake/Modules/FindPytorch.cmake": (_FIND_PYTORCH_CPU_ONLY,),
    "CMakeLists.txt": (_TOP_GLOO17, _TOP_ABI, _TOP_GLOO_ON_DEMAND),
}
# g++ 13's libstdc++ no longer drags <cstdint>/<string>/<stdexcept> in through other standard headers;
# 0.28.1's headers relied on that (fixed upstream after the release, horovod#3957). group_table.h is the
# leaf every other header reaches (via message.h), common.h the one that throws std::logic_error.
GCC13_MARKER = "// hvdtrain: includes that g++ 13 needs"
HEADER_PATCHES = {
    "horovod/common/group_table.h": ((
        "#include <mutex>\n#include <queue>\n",
        f"{GCC13_MARKER}\n#include <cstdint>\n#include <string>\n#include <mutex>\n#include <queue>\n"),),
    "horovod/common/common.h": ((
        "#include <functional>\n#include <memory>\n",
        f"{GCC13_MARKER}\n#include <cstdint>\n#include <stdexcept>\n#include <functional>\n#include <memory>\n"),),
}


PATCH_DIR = Path(__file__).resolve().parent / "horovod" / "patches"


def series(patch_dir: Path = PATCH_DIR) -> list[Path]:
    """The patch files of `series`, in order (blank lines and # comments skipped)."""
    names = [line.strip() for line in (patch_dir / "series").read_text().splitlines()]
    return [patch_dir / name for name in names if name and not name.startswith("#")]


def series_hash(patch_dir: Path = PATCH_DIR) -> str:
    """A digest of what the series changes (each patch's diff, in order; not its header, which only explains):
    part of the wheel cache key."""
    digest = hashlib.sha256()
    for path in series(patch_dir):
        digest.update(path.read_bytes().split(b"\n---\n", 1)[-1] + b"\0")
    return digest.hexdigest()[:10]


PATCH_SET_HASH = patch_set_hash(PATCHES, HEADER_PATCHES, BF16_PATCHES, PERF_PATCHES) + series_hash()


def patch_text(text: str, replacements: tuple[tuple[str, str], ...], name: str, marker: str = CXX17_MARKER) -> str:
    """Apply each (old, new) exactly once; text already carrying the marker is returned as is."""
    if marker in text:
        return text
    for old, new in replacements:
        count = text.count(old)
        if count != 1:
            raise InstallError(f"{name}: expected the anchor once, found it {count} times: "
                               f"{old.splitlines()[0]!r} (is this really horovod {HOROVOD_VERSION}?)")
        text = text.replace(old, new)
    return text


def apply_cxx17_fix(src_dir: Path, patches: Mapping[str, tuple[tuple[str, str], ...]] = PATCHES,
                    marker: str = CXX17_MARKER) -> bool:
    """Patch an unpacked horovod source tree in place. Returns False if it was already patched."""
    changed = False
    for rel, replacements in patches.items():
        path = src_dir / rel
        before = path.read_text()
        after = patch_text(before, replacements, rel, marker)
        if after != before:
            path.write_text(after)
            changed = True
    return changed


def apply_series(src_dir: Path, patch_dir: Path = PATCH_DIR) -> list[str]:
    """Apply every patch of the series to an unpacked horovod tree, exactly (no fuzz); the names applied.
    A patch that does not apply cleanly stops the build with one line naming it."""
    applied = []
    for path in series(patch_dir):
        done = subprocess.run(["patch", "-p1", "--forward", "--fuzz=0", "--batch", "-i", str(path)], cwd=src_dir,
                              capture_output=True, text=True)
        if done.returncode != 0:
            detail = (done.stdout + done.stderr).strip().splitlines()
            raise InstallError(f"{path.name} does not apply to horovod {HOROVOD_VERSION}: "
                               f"{detail[-1] if detail else 'patch failed'}")
        applied.append(path.name)
    return applied


def stamp_patch_set(src_dir: Path, digest: str = PATCH_SET_HASH) -> None:
    """Record the patch set in the package (horovod.hvdtrain_patches.PATCH_SET), so an installed Horovod built before
    a patch changed is found out and rebuilt (installed_matches)."""
    (src_dir / "horovod" / "hvdtrain_patches.py").write_text(
        f'"""Written by hvdtrain\'s scripts/install_horovod.py: the digest of the patch set this build carries."""\n'
        f"PATCH_SET = {digest!r}\n")


def apply_gcc13_fix(src_dir: Path) -> bool:
    """Add the standard includes g++ 13 needs to 0.28.1's headers. Returns False if already there."""
    return apply_cxx17_fix(src_dir, HEADER_PATCHES, GCC13_MARKER)


def apply_bf16(src_dir: Path) -> bool:
    """Give Horovod a bfloat16 data type (scripts/horovod_bf16.py). Returns False if already there."""
    return apply_cxx17_fix(src_dir, BF16_PATCHES, BF16_MARKER)


def apply_perf(src_dir: Path) -> bool:
    """Idle ranks wait for work instead of negotiating every cycle (scripts/horovod_perf.py). False if already there."""
    return apply_cxx17_fix(src_dir, PERF_PATCHES, PERF_MARKER)


def parse_check_build(output: str) -> dict[str, bool]:
    """`horovodrun --check-build` lines like '[X] PyTorch' -> {'PyTorch': True}.

    Controllers and tensor ops both list MPI and Gloo; a name counts as built only if every
    line naming it is checked.
    """
    found: dict[str, bool] = {}
    for mark, name in re.findall(r"\[([ X])\]\s+(\w+)", output):
        found[name] = found.get(name, True) and mark == "X"
    return found


def missing_tools(which=shutil.which, tools: dict[str, str] = SYSTEM_TOOLS) -> list[str]:
    return [tool for tool in tools if which(tool) is None]


# ---------------------------------------------------------------- side effects

def say(message: str) -> None:
    print(f"[install-horovod] {message}", flush=True)


def run(cmd: list[str], log: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    if log is None:
        return subprocess.run(cmd, env=env, text=True, capture_output=True)
    with log.open("a") as handle:
        handle.write(f"\n$ {' '.join(cmd)}\n")
        handle.flush()
        return subprocess.run(cmd, env=env, text=True, stdout=handle, stderr=subprocess.STDOUT)


def probe_torch(python: str) -> tuple[str, str | None]:
    code = "import torch; print(torch.__version__); print(torch.version.cuda or '')"
    proc = run([python, "-c", code])
    if proc.returncode != 0:
        raise InstallError(f"torch is not importable by {python}; install it first "
                           "(e.g. `pip install torch==2.13.0`, or `make setup`)")
    version, cuda = (proc.stdout.strip().splitlines() + [""])[:2]
    return version, (cuda or None)


NCCL_ROOTS = ("/usr", "/usr/local/cuda", "/usr/local", "/opt/nccl")
NCCL_LIB_DIRS = ("lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu", "lib64", "lib")
NCCL_LIBS = ("libnccl.so", "libnccl_static.a")


def find_nccl(environ: Mapping[str, str], exists=os.path.exists) -> dict[str, str] | None:
    """Where NCCL's header and library are, as the HOROVOD_NCCL_* variables Horovod's build reads.

    Looks under HOROVOD_NCCL_HOME / HOROVOD_NCCL_INCLUDE+LIB (the user's word wins), NCCL_HOME,
    CUDA_HOME / CUDA_PATH and the usual prefixes (Debian's libnccl-dev, the CUDA toolkit, /opt/nccl).
    None when no folder holds both nccl.h and libnccl.so (or libnccl_static.a).
    """
    if environ.get("HOROVOD_NCCL_HOME") or environ.get("HOROVOD_NCCL_INCLUDE"):
        return {}   # the user's own settings, passed through untouched
    roots = [environ.get(k, "") for k in ("NCCL_HOME", "CUDA_HOME", "CUDA_PATH")] + list(NCCL_ROOTS)
    for root in filter(None, roots):
        if not exists(f"{root}/include/nccl.h"):
            continue
        for lib in NCCL_LIB_DIRS:
            if any(exists(f"{root}/{lib}/{name}") for name in NCCL_LIBS):
                return {"HOROVOD_NCCL_INCLUDE": f"{root}/include", "HOROVOD_NCCL_LIB": f"{root}/{lib}"}
    return None


def find_nccl_wheel(site_dirs: list[str], exists=os.path.exists, glob=None) -> dict[str, str] | None:
    """NCCL inside torch's own `nvidia-nccl-cu*` wheel: `nvidia/<pkg>/include/nccl.h` and `lib/libnccl.so.2`.

    The wheel ships only the versioned library, while Horovod's FindNCCL looks for `libnccl.so` (or the
    static archive): the caller links `libnccl.so` to it in a build folder (see `nccl_link_dir`) and sets
    HOROVOD_NCCL_LINK=SHARED. At run time torch has already loaded that same libnccl.so.2.
    """
    from glob import glob as real_glob
    glob = glob or real_glob
    for site in site_dirs:
        for header in sorted(glob(f"{site}/nvidia/*/include/nccl.h")):
            root = header[:-len("/include/nccl.h")]
            if exists(f"{root}/lib/libnccl.so.2"):
                return {"HOROVOD_NCCL_INCLUDE": f"{root}/include", "HOROVOD_NCCL_LIB": f"{root}/lib",
                        "HOROVOD_NCCL_LINK": "SHARED"}
    return None


def nccl_link_dir(nccl_env: dict[str, str], folder: Path) -> dict[str, str]:
    """For a wheel's NCCL: a folder holding `libnccl.so` -> the wheel's libnccl.so.2, as FindNCCL wants."""
    lib = Path(nccl_env["HOROVOD_NCCL_LIB"])
    if (lib / "libnccl.so").exists() or not (lib / "libnccl.so.2").exists():
        return nccl_env
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "libnccl.so"
    if not link.exists():
        link.symlink_to(lib / "libnccl.so.2")
    return dict(nccl_env, HOROVOD_NCCL_LIB=str(folder))


def find_nvcc(environ: Mapping[str, str], site_dirs: list[str], which=shutil.which, exists=os.path.exists,
              glob=None) -> str | None:
    """The CUDA root (folder of bin/nvcc) the GPU build should use: HOROVOD_CUDA_HOME, CUDA_HOME/CUDA_PATH,
    nvcc on PATH, /usr/local/cuda, then an `nvidia-cuda-nvcc*` wheel in site-packages."""
    from glob import glob as real_glob
    glob = glob or real_glob
    for name in ("HOROVOD_CUDA_HOME", "CUDA_HOME", "CUDA_PATH"):
        root = environ.get(name, "")
        if root and exists(f"{root}/bin/nvcc"):
            return root
    on_path = which("nvcc")
    if on_path:
        return str(Path(on_path).resolve().parent.parent)
    if exists("/usr/local/cuda/bin/nvcc"):
        return "/usr/local/cuda"
    for site in site_dirs:
        for nvcc in sorted(glob(f"{site}/nvidia/*/bin/nvcc")):
            return nvcc[:-len("/bin/nvcc")]
    return None


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


def gpu_compute_caps(which=shutil.which) -> list[str]:
    """Compute capabilities of this machine's NVIDIA GPUs ([] when none, or no driver to ask)."""
    smi = which("nvidia-smi")
    if not smi:
        return []
    try:
        proc = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"], text=True,
                              capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in proc.stdout.splitlines() if line.strip()] if proc.returncode == 0 else []


def site_packages(python: str) -> list[str]:
    proc = run([python, "-c", "import site, sys; print('\\n'.join(site.getsitepackages()))"])
    return [line for line in proc.stdout.splitlines() if line] if proc.returncode == 0 else []


def expected_build(cuda: str | None, nccl: bool) -> tuple[str, ...]:
    """What `horovodrun --check-build` must show: NCCL too for a CUDA torch built with NCCL."""
    return EXPECTED_BUILD + (("NCCL",) if cuda and nccl else ())


NCCL_MISSING = ("NCCL (nccl.h and libnccl.so under HOROVOD_NCCL_HOME, NCCL_HOME, CUDA_HOME, /usr, /usr/local/cuda "
                "or torch's nvidia-nccl wheel: install libnccl-dev, or set HVDTRAIN_ALLOW_NO_NCCL=1 to build "
                "without it, sending GPU tensors through host memory)")


def nvcc_missing(cuda: str) -> str:
    return f"nvcc (install the CUDA {cuda} toolkit, or `pip install '{nvcc_wheel(cuda)}'`)"


def apt_install(packages: list[str], log: Path) -> bool:
    say(f"installing system packages with apt: {' '.join(packages)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    return run(["apt-get", "update"], log, env).returncode == 0 and run(
        ["apt-get", "install", "-y", "--no-install-recommends", *packages], log, env).returncode == 0


def can_apt(use_apt: bool) -> bool:
    return use_apt and os.geteuid() == 0 and shutil.which("apt-get") is not None


def ensure_system_tools(log: Path, use_apt: bool = True) -> None:
    missing = missing_tools()
    if not missing:
        return
    packages = sorted({SYSTEM_TOOLS[tool] for tool in missing})
    if not can_apt(use_apt):
        raise InstallError(f"missing {', '.join(missing)}; install the packages "
                           f"{' '.join(packages)} (e.g. `sudo apt-get install {' '.join(packages)}`)")
    if not apt_install(packages, log):
        raise InstallError(f"apt-get could not install {' '.join(packages)} (no network to the "
                           f"package mirror?); full log: {log}")
    still = missing_tools()
    if still:
        raise InstallError(f"still missing after apt: {', '.join(still)}; full log: {log}")


def ensure_test_tools(log: Path, use_apt: bool = True, which=shutil.which) -> list[str]:
    """Best effort: install what only tests need. Returns what is still missing (those tests skip)."""
    missing = missing_tools(which, TEST_TOOLS)
    packages = sorted({TEST_TOOLS[tool] for tool in missing})
    if missing and can_apt(use_apt) and apt_install(packages, log):
        missing = missing_tools(which, TEST_TOOLS)
    if missing:
        say(f"note: {', '.join(missing)} missing (Debian package {' '.join(packages)}); "
            f"tests that need it will skip")
    return missing


def download_sdist(python: str, dest: Path, log: Path) -> Path:
    say(f"downloading the horovod {HOROVOD_VERSION} source distribution with pip")
    proc = run([python, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                f"horovod=={HOROVOD_VERSION}", "-d", str(dest)], log)
    archives = list(dest.glob(f"horovod-{HOROVOD_VERSION}.tar.gz"))
    if proc.returncode != 0 or not archives:
        raise InstallError(f"pip could not download horovod=={HOROVOD_VERSION} (no network to "
                           f"the package index?); full log: {log}")
    extract_archive(archives[0], dest)
    return dest / f"horovod-{HOROVOD_VERSION}"


def extract_archive(archive: Path, dest: Path, data_filter: bool = hasattr(tarfile, "data_filter")) -> None:
    """Unpack a source archive, refusing members that would land outside `dest`.

    Pythons with tarfile's extraction filters (3.12, and 3.11.4+) use the 'data' filter. Older ones
    (Debian 12's python3 is 3.11.2) get the same refusal of absolute paths, `..`, links leaving
    `dest` and device files, checked here before extracting.
    """
    with tarfile.open(archive) as tar:
        if data_filter:
            tar.extractall(dest, filter="data")
            return
        root = dest.resolve()
        for member in tar.getmembers():
            target = (dest / member.name).resolve()
            link = (target.parent / member.linkname).resolve() if member.issym() else (
                (dest / member.linkname).resolve() if member.islnk() else target)
            if (not target.is_relative_to(root) or not link.is_relative_to(root)
                    or member.isdev() or os.path.isabs(member.name)):
                raise InstallError(f"{archive.name}: refusing unsafe member {member.name!r}")
        tar.extractall(dest)


def build_env(cuda: str | None, nccl: bool, nccl_env: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ, **(nccl_env or {}))
    env.update(HOROVOD_WITH_PYTORCH="1", HOROVOD_WITH_MPI="1", HOROVOD_WITH_GLOO="1",
               HOROVOD_WITHOUT_TENSORFLOW="1", HOROVOD_WITHOUT_MXNET="1")
    env.setdefault("MAKEFLAGS", f"-j{os.cpu_count() or 2}")
    # CMake 4 (PyPI's `cmake`) refuses projects declaring compatibility below 3.5, as the bundled gloo does (2.8.12).
    env.setdefault("CMAKE_POLICY_VERSION_MINIMUM", "3.5")
    if cuda and nccl:
        env.setdefault("HOROVOD_GPU_OPERATIONS", "NCCL")
    return env


def compile_wheel(python: str, src: Path, out: Path, env: dict[str, str], log: Path) -> Path:
    # --no-build-isolation: the build must see the installed torch, so its build tools come from here.
    if run([python, "-m", "pip", "install", "setuptools", "wheel"], log).returncode != 0:
        raise InstallError(f"pip could not install setuptools/wheel for the build; full log: {log}")
    say(f"compiling horovod {HOROVOD_VERSION} (C++: core, gloo, torch extension). "
        f"This takes about 4-10 minutes on 2 cores (longer when the machine is busy) and happens once per "
        f"torch/Python version; log: {log}")
    done = threading.Event()
    start = time.monotonic()

    def heartbeat() -> None:
        while not done.wait(60):
            say(f"  still compiling ... {int(time.monotonic() - start) // 60} min elapsed")

    threading.Thread(target=heartbeat, daemon=True).start()
    try:
        proc = run([python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v",
                    "-w", str(out), str(src)], log, env)
    finally:
        done.set()
    wheels = list(out.glob("horovod-*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
        print(tail, file=sys.stderr)
        raise InstallError(f"horovod build failed after {int(time.monotonic() - start)} s; "
                           f"full build log: {log}")
    say(f"built {wheels[0].name} in {int(time.monotonic() - start)} s")
    return wheels[0]


def install_wheel(python: str, wheel: Path, log: Path) -> None:
    proc = run([python, "-m", "pip", "install", "--force-reinstall", "--no-deps", str(wheel)], log)
    # Horovod's own runtime dependencies, without touching torch.
    proc2 = run([python, "-m", "pip", "install", "cloudpickle", "psutil", "pyyaml", "packaging"], log)
    if proc.returncode != 0 or proc2.returncode != 0:
        raise InstallError(f"pip could not install {wheel.name}; full log: {log}")


def verify(python: str, expected: tuple[str, ...] = EXPECTED_BUILD) -> str:
    horovodrun = Path(python).parent / "horovodrun"
    proc = run([str(horovodrun) if horovodrun.exists() else "horovodrun", "--check-build"])
    built = parse_check_build(proc.stdout)
    missing = [name for name in expected if not built.get(name)]
    if proc.returncode != 0 or missing:
        raise InstallError(f"horovodrun --check-build is missing {', '.join(missing) or '?'}:\n"
                           f"{proc.stdout}{proc.stderr}")
    return proc.stdout


def installed_matches(python: str, torch_version: str) -> bool:
    """Horovod HOROVOD_VERSION is installed, imports, carries hvdtrain's patches (the bfloat16 binding; the idle-cycle
    and exchange-allreduce variables' names compiled into the extension; the digest of this very patch set: a wheel
    built before one changed must be rebuilt), and was built against this very torch: its metadata.json names the torch it was compiled with (a
    torch upgrade or a CPU/CUDA switch must rebuild it)."""
    code = ("import horovod, horovod.torch, horovod.torch.mpi_lib_v2 as lib, json, os, torch; "
            f"assert horovod.__version__ == {HOROVOD_VERSION!r}; "
            f"assert hasattr(lib, {BF16_BINDING!r}); "
            "lib_bytes = open(lib.__file__, 'rb').read(); "
            f"assert {IDLE_ENV.encode()!r} in lib_bytes and {EXCHANGE_ENV.encode()!r} in lib_bytes; "
            f"assert torch.__version__ == {torch_version!r}; "
            "meta = json.load(open(os.path.join(os.path.dirname(horovod.__file__), 'metadata.json'))); "
            f"assert meta.get('pytorch') == {torch_version!r}; "
            "import horovod.hvdtrain_patches as stamp; "
            f"assert stamp.PATCH_SET == {PATCH_SET_HASH!r}")
    return run([python, "-c", code]).returncode == 0


def plan_gpu_build(python: str, torch_cuda: str | None, environ: Mapping[str, str], cache_root: Path,
                   use_pip: bool = True) -> tuple[str | None, bool, dict[str, str]]:
    """(CUDA of the GPU build or None for CPU, NCCL built in, the build's extra variables), one line said.

    A CUDA torch on a machine with no NVIDIA GPU builds Horovod for CPU (nothing to set). With a GPU: NCCL
    from the system or torch's own nvidia-nccl wheel, nvcc from the system or the matching nvidia-cuda-nvcc
    wheel (installed when missing), and only the architectures of the GPUs present.
    """
    if not torch_cuda:
        return None, False, {}
    caps = gpu_compute_caps()
    if not gpu_wanted(environ, caps):
        say(cpu_on_cuda_torch_note(torch_cuda))
        return None, False, {"HVDTRAIN_HOROVOD_CPU_ONLY": "1"}
    sites = site_packages(python)
    nccl_env = find_nccl(environ)
    if nccl_env is None:
        wheel = find_nccl_wheel(sites)
        if wheel:
            say(f"NCCL from torch's wheel: {wheel['HOROVOD_NCCL_LIB']}")
            nccl_env = nccl_link_dir(wheel, cache_root / "nccl-link")
    cuda_root = find_nvcc(environ, sites)
    if cuda_root is None and use_pip:
        say(f"no nvcc on this machine: installing {nvcc_wheel(torch_cuda)} (CUDA {torch_cuda}, as torch)")
        if run([python, "-m", "pip", "install", "-q", nvcc_wheel(torch_cuda)]).returncode == 0:
            cuda_root = find_nvcc(environ, site_packages(python))
    missing = ([] if nccl_env is not None or environ.get("HVDTRAIN_ALLOW_NO_NCCL") else [NCCL_MISSING]) + (
        [nvcc_missing(torch_cuda)] if cuda_root is None else [])
    if missing:
        raise InstallError(gpu_missing_message(torch_cuda, missing))
    env = dict(nccl_env or {})
    if cuda_root and not environ.get("HOROVOD_CUDA_HOME"):
        env["HOROVOD_CUDA_HOME"] = cuda_root
    if caps and not environ.get("HOROVOD_BUILD_CUDA_CC_LIST"):
        env["HOROVOD_BUILD_CUDA_CC_LIST"] = cc_list_of(caps)
    say(f"GPU build: CUDA {torch_cuda}, nvcc in {cuda_root}, NCCL {'yes' if nccl_env is not None else 'no'}, "
        f"architectures {env.get('HOROVOD_BUILD_CUDA_CC_LIST') or environ.get('HOROVOD_BUILD_CUDA_CC_LIST') or 'all'}")
    return torch_cuda, nccl_env is not None, env


def install(python: str, cache_root: Path, force: bool, use_apt: bool = True, test_tools: bool = True) -> None:
    (cache_root / "logs").mkdir(parents=True, exist_ok=True)
    # Before the early returns below: a machine with Horovod cached may still lack test tools.
    if test_tools:
        ensure_test_tools(cache_root / "logs" / "test-tools.log", use_apt)
    torch_version, torch_cuda = probe_torch(python)
    cuda, nccl, gpu_env = plan_gpu_build(python, torch_cuda, os.environ, cache_root, use_apt)
    expected = expected_build(cuda, nccl)
    py = ".".join(map(str, sys.version_info[:2]))
    if not force and installed_matches(python, torch_version):
        try:
            verify(python, expected)
        except InstallError as err:   # e.g. built before NCCL was installed: build again, with it
            say(f"the installed horovod does not match this machine ({str(err).splitlines()[0]}); rebuilding")
        else:
            say(f"horovod {HOROVOD_VERSION} for torch {torch_version} already installed and verified")
            return
    cc_list = gpu_env.get("HOROVOD_BUILD_CUDA_CC_LIST", os.environ.get("HOROVOD_BUILD_CUDA_CC_LIST", ""))
    key = cache_key(HOROVOD_VERSION, torch_version, py, cuda, nccl, cc_list, torch_cuda=torch_cuda)
    cache_dir = cache_root / "wheels" / key
    log_dir = cache_root / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{key}.log"
    log.write_text("")
    cached = sorted(cache_dir.glob("horovod-*.whl"))
    if cached and not force:
        say(f"using cached wheel {cached[0]}")
        try:
            install_wheel(python, cached[0], log)
            verify(python, expected)
        except InstallError as err:
            # E.g. a wheel copied from another machine whose MPI libraries differ: build a fresh one.
            say(f"the cached wheel does not work here ({str(err).splitlines()[0]}); removing it and building")
            cached[0].unlink()
        else:
            say(f"verified: {', '.join(expected)} are built in")
            return
    ensure_system_tools(log, use_apt)
    with tempfile.TemporaryDirectory(prefix="hvdtrain-horovod-") as tmp:
        src = download_sdist(python, Path(tmp), log)
        apply_gcc13_fix(src)  # harmless for older compilers: only standard includes
        apply_bf16(src)
        apply_perf(src)
        apply_series(src)
        stamp_patch_set(src)
        if needs_cxx17(torch_version):
            apply_cxx17_fix(src)
            standard = torch_cxx_standard(python)
            gpu_env = {**gpu_env, "HVDTRAIN_TORCH_CXX_STANDARD": str(standard)}
            say(f"torch {torch_version} needs C++{standard}: applied hvdtrain's build fix")
        wheel = compile_wheel(python, src, Path(tmp) / "dist", build_env(cuda, nccl, gpu_env), log)
        install_wheel(python, wheel, log)
        print(verify(python, expected))
        # Cache only a wheel that verified, so a broken build is never reused.
        cache_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(wheel, cache_dir / wheel.name)
    say(f"verified and cached in {cache_dir}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, default=Path(os.environ.get(
        "HVDTRAIN_CACHE", Path.home() / ".cache" / "hvdtrain")), help="wheel cache root")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    parser.add_argument("--no-apt", action="store_true",
                        help="never install system packages; stop and name the missing ones")
    parser.add_argument("--no-test-tools", action="store_true",
                        help="skip the tools only hvdtrain's tests need (sshd), e.g. in an image")
    args = parser.parse_args(argv)
    try:
        install(sys.executable, args.cache_dir, args.force, use_apt=not args.no_apt,
                test_tools=not args.no_test_tools)
    except InstallError as err:
        print(f"install-horovod: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
