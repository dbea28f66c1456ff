"""The toolchain of scripts/install_horovod.py: what is on this machine to build Horovod with.

Standard library only. Finds torch (its version, its CUDA, the C++ standard its headers demand), the system tools
(installed with apt where allowed), NCCL, the GPUs present and the CUDA toolkit. The toolkit is found the way users
have it: CUDA_HOME, CUDAToolkit_ROOT, the `nvcc` on PATH even when that is a wrapper script (conda, environment
modules and some images put one in /usr/local/bin, where CMake's FindCUDAToolkit then finds no headers), then
/usr/local/cuda and the nvidia wheels; the build is handed CUDA_HOME, CUDAToolkit_ROOT and CUDACXX pointing at it.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from glob import glob as real_glob
from pathlib import Path

from install_plan import (
    NCCL_MISSING,
    SYSTEM_TOOLS,
    TEST_TOOLS,
    InstallError,
    cc_list_of,
    cpu_on_cuda_torch_note,
    cxx_standard_of,
    gpu_missing_message,
    gpu_wanted,
    missing_tools,
    nvcc_missing,
    nvcc_wheel,
)

NCCL_ROOTS = ("/usr", "/usr/local/cuda", "/usr/local", "/opt/nccl")
NCCL_LIB_DIRS = ("lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu", "lib64", "lib")
NCCL_LIBS = ("libnccl.so", "libnccl_static.a")
# Where the user names a toolkit; the first is Horovod's own, CUDAToolkit_ROOT is CMake's.
CUDA_ROOT_VARIABLES = ("HOROVOD_CUDA_HOME", "CUDA_HOME", "CUDA_PATH", "CUDAToolkit_ROOT")


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


def torch_cxx_standard(python: str) -> int:
    code = ("import os, torch; print(open(os.path.join(os.path.dirname(torch.__file__), 'include', 'torch', 'csrc', "
            "'api', 'include', 'torch', 'all.h')).read())")
    proc = run([python, "-c", code])
    return cxx_standard_of(proc.stdout) if proc.returncode == 0 else 17


def site_packages(python: str) -> list[str]:
    proc = run([python, "-c", "import site, sys; print('\\n'.join(site.getsitepackages()))"])
    return [line for line in proc.stdout.splitlines() if line] if proc.returncode == 0 else []


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


def find_nccl_wheel(site_dirs: list[str], exists=os.path.exists, glob=real_glob) -> dict[str, str] | None:
    """NCCL inside torch's own `nvidia-nccl-cu*` wheel: `nvidia/<pkg>/include/nccl.h` and `lib/libnccl.so.2`.

    The wheel ships only the versioned library, while Horovod's FindNCCL looks for `libnccl.so` (or the
    static archive): the caller links `libnccl.so` to it in a build folder (see `nccl_link_dir`) and sets
    HOROVOD_NCCL_LINK=SHARED. At run time torch has already loaded that same libnccl.so.2.
    """
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


def is_toolkit(root: str, exists=os.path.exists, glob=real_glob) -> bool:
    """A CUDA toolkit folder: bin/nvcc and cuda_runtime.h, in include/ or targets/<arch>/include/ (its layout)."""
    return exists(f"{root}/bin/nvcc") and (exists(f"{root}/include/cuda_runtime.h")
                                           or bool(glob(f"{root}/targets/*/include/cuda_runtime.h")))


def nvcc_reported_root(nvcc: str) -> str | None:
    """The toolkit an `nvcc` runs from, as nvcc itself reports it: `nvcc -v` prints its nvcc.profile settings
    (`#$ TOP=/usr/local/cuda-13.0/bin/..`) before it looks at its input. CMake's own CUDA detection reads the same
    line; it is what sees through a wrapper script, whose own folder holds no toolkit."""
    try:
        proc = subprocess.run([nvcc, "-v", "__hvdtrain_find_cuda_toolkit"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"^#\$ TOP=(.+)$", proc.stdout + proc.stderr, re.MULTILINE)
    return os.path.normpath(found.group(1).strip()) if found else None


def find_cuda_toolkit(environ: Mapping[str, str], site_dirs: list[str], which=shutil.which, exists=os.path.exists,
                      glob=real_glob) -> tuple[str, str] | None:
    """(the CUDA toolkit's root, where it was found) for the GPU build, or None.

    In order: HOROVOD_CUDA_HOME, CUDA_HOME, CUDA_PATH, CUDAToolkit_ROOT; the `nvcc` on PATH, through symlinks, or
    the folder it reports when it is a wrapper script; /usr/local/cuda; an `nvidia-cuda-nvcc*` wheel in
    site-packages (nvcc only: its headers come from torch's nvidia wheels).
    """
    for name in CUDA_ROOT_VARIABLES:
        root = environ.get(name, "")
        if root and exists(f"{root}/bin/nvcc"):
            return root, name
    on_path = which("nvcc")
    if on_path:
        beside = str(Path(on_path).resolve().parent.parent)
        if is_toolkit(beside, exists, glob):
            return beside, f"nvcc on PATH ({on_path})"
        reported = nvcc_reported_root(on_path)
        if reported and exists(f"{reported}/bin/nvcc"):
            return reported, f"the folder the nvcc on PATH ({on_path}) reports"
    if exists("/usr/local/cuda/bin/nvcc"):
        return "/usr/local/cuda", "/usr/local/cuda"
    for site in site_dirs:
        for nvcc in sorted(glob(f"{site}/nvidia/*/bin/nvcc")):
            return nvcc[:-len("/bin/nvcc")], "the nvidia-cuda-nvcc wheel"
    return None


def toolkit_env(root: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that point Horovod's CMake (and FindCUDAToolkit) at `root`; any the user set are kept."""
    wanted = {"HOROVOD_CUDA_HOME": root, "CUDA_HOME": root, "CUDAToolkit_ROOT": root, "CUDACXX": f"{root}/bin/nvcc"}
    return {name: value for name, value in wanted.items() if not environ.get(name)}


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


def plan_gpu_build(python: str, torch_cuda: str | None, environ: Mapping[str, str], cache_root: Path,
                   use_pip: bool = True) -> tuple[str | None, bool, dict[str, str]]:
    """(CUDA of the GPU build or None for CPU, NCCL built in, the build's extra variables), one line said.

    A CUDA torch on a machine with no NVIDIA GPU builds Horovod for CPU (patch 0006's switch). With a GPU: NCCL
    from the system or torch's own nvidia-nccl wheel, the CUDA toolkit (find_cuda_toolkit, or the matching
    nvidia-cuda-nvcc wheel, installed when none is found), and only the architectures of the GPUs present.
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
    toolkit = find_cuda_toolkit(environ, sites)
    if toolkit is None and use_pip:
        say(f"no CUDA toolkit on this machine: installing {nvcc_wheel(torch_cuda)} (CUDA {torch_cuda}, as torch)")
        if run([python, "-m", "pip", "install", "-q", nvcc_wheel(torch_cuda)]).returncode == 0:
            toolkit = find_cuda_toolkit(environ, site_packages(python))
    missing = ([] if nccl_env is not None or environ.get("HVDTRAIN_ALLOW_NO_NCCL") else [NCCL_MISSING]) + (
        [nvcc_missing(torch_cuda)] if toolkit is None else [])
    if missing or toolkit is None:
        raise InstallError(gpu_missing_message(torch_cuda, missing))
    env = dict(nccl_env or {}, **toolkit_env(toolkit[0], environ))
    if caps and not environ.get("HOROVOD_BUILD_CUDA_CC_LIST"):
        env["HOROVOD_BUILD_CUDA_CC_LIST"] = cc_list_of(caps)
    say(f"GPU build: CUDA {torch_cuda}, toolkit {toolkit[0]} (from {toolkit[1]}), "
        f"NCCL {'yes' if nccl_env is not None else 'no'}, "
        f"architectures {env.get('HOROVOD_BUILD_CUDA_CC_LIST') or environ.get('HOROVOD_BUILD_CUDA_CC_LIST') or 'all'}")
    return torch_cuda, nccl_env is not None, env


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
