"""The build of scripts/install_horovod.py: fetch the sdist, apply the patch series, compile, install, verify, cache.

Standard library only. hvdtrain's changes to Horovod are the unified diffs listed in patches/series, applied here
with `patch -p1 --forward --fuzz=0` and nowhere else; the build is stamped with the series' digest
(horovod.hvdtrain_patches.PATCH_SET) so an installed Horovod built before a patch changed is found out and rebuilt.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

from install_plan import (
    BF16_BINDING,
    EXCHANGE_ENV,
    EXPECTED_BUILD,
    HOROVOD_VERSION,
    IDLE_ENV,
    PATCH_DIR,
    PATCH_SET_HASH,
    SDIST_SHA256,
    InstallError,
    cache_key,
    expected_build,
    needs_cxx17,
    parse_check_build,
    series,
)
from install_toolchain import (
    ensure_system_tools,
    ensure_test_tools,
    plan_gpu_build,
    probe_torch,
    run,
    say,
    torch_cxx_standard,
)

SDIST = f"horovod-{HOROVOD_VERSION}.tar.gz"


def download_sdist(python: str, dest: Path, log: Path, cache: Path | None = None) -> Path:
    """The pristine sdist unpacked in `dest`: from `cache` (a folder) when it holds it, else downloaded with pip
    (and kept in `cache`). Either way its digest must be SDIST_SHA256, the bytes the series was written against."""
    archive = cache / SDIST if cache is not None and (cache / SDIST).is_file() else None
    if archive is None:
        say(f"downloading the horovod {HOROVOD_VERSION} source distribution with pip")
        proc = run([python, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    f"horovod=={HOROVOD_VERSION}", "-d", str(dest)], log)
        if proc.returncode != 0 or not (dest / SDIST).is_file():
            raise InstallError(f"pip could not download horovod=={HOROVOD_VERSION} (no network to "
                               f"the package index?); full log: {log}")
        archive = dest / SDIST
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise InstallError(f"{archive} has sha256 {digest[:16]}..., not the horovod {HOROVOD_VERSION} sdist the "
                           f"patch series is written for; remove it and run again")
    if cache is not None and archive.parent != cache:
        cache.mkdir(parents=True, exist_ok=True)
        shutil.copy2(archive, cache / SDIST)
    extract_archive(archive, dest)
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
    """Record the series' digest in the package (horovod.hvdtrain_patches.PATCH_SET), so an installed Horovod built
    before a patch changed is found out and rebuilt (installed_matches)."""
    (src_dir / "horovod" / "hvdtrain_patches.py").write_text(
        f'"""Written by hvdtrain\'s scripts/install_horovod.py: the digest of the patch set this build carries."""\n'
        f"PATCH_SET = {digest!r}\n")


def build_env(cuda: str | None, nccl: bool, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ, **(extra or {}))
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
        f"This takes 2-10 minutes on 2 cores (docs/install.md#how-long-the-horovod-build-takes) and happens once per "
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
    and exchange-allreduce variables' names compiled into the extension; the digest of this very series: a wheel
    built before a patch changed must be rebuilt), and was built against this very torch: its metadata.json names
    the torch it was compiled with (a torch upgrade or a CPU/CUDA switch must rebuild it)."""
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


def install(python: str, cache_root: Path, force: bool, use_apt: bool = True, test_tools: bool = True) -> None:
    log_dir = cache_root / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    # Before the early returns below: a machine with Horovod cached may still lack test tools.
    if test_tools:
        ensure_test_tools(log_dir / "test-tools.log", use_apt)
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
        src = download_sdist(python, Path(tmp), log, cache_root / "sdist")
        say(f"applied {len(apply_series(src))} patches of {PATCH_DIR / 'series'} (digest {PATCH_SET_HASH})")
        stamp_patch_set(src)
        if needs_cxx17(torch_version):
            standard = torch_cxx_standard(python)
            gpu_env = {**gpu_env, "HVDTRAIN_TORCH_CXX_STANDARD": str(standard)}
            say(f"torch {torch_version} needs C++{standard}: the torch extension is built as such (patch 0005)")
        wheel = compile_wheel(python, src, Path(tmp) / "dist", build_env(cuda, nccl, gpu_env), log)
        install_wheel(python, wheel, log)
        print(verify(python, expected))
        # Cache only a wheel that verified, so a broken build is never reused.
        cache_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(wheel, cache_dir / wheel.name)
    say(f"verified and cached in {cache_dir}")
