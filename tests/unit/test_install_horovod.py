"""The Horovod build script (scripts/install_horovod.py; its plan, toolchain and build in scripts/horovod/): its pure
parts, how it finds what it builds with, and its failures (each a clear message, nothing claimed). The patch series
itself: test_horovod_patches.py."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import install_build as build
import install_plan as plan
import install_toolchain as toolchain
import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_parse_version_handles_local_and_pre_release_tags():
    assert plan.parse_version("2.13.0+cpu") == (2, 13, 0)
    assert plan.parse_version("2.1.0a0+git1234") == (2, 1, 0)
    assert plan.parse_version("1.13") == (1, 13, 0)
    with pytest.raises(plan.InstallError, match="cannot parse version"):
        plan.parse_version("nightly")


@pytest.mark.parametrize("torch_version, expected", [
    ("2.0.1", False), ("1.13.1+cu117", False), ("2.1.0", True), ("2.13.0+cpu", True), ("3.0.0", True)])
def test_cxx17_fix_needed_from_torch_2_1(torch_version, expected):
    assert plan.needs_cxx17(torch_version) is expected


def test_cache_key_changes_with_every_build_input():
    base = dict(horovod="0.28.1", torch="2.13.0+cpu", python="3.11", cuda=None, nccl=False)
    key = plan.cache_key(**base)
    assert key == f"horovod-0.28.1-torch2.13.0_cpu-py3.11-cpu-p{plan.PATCH_SET_HASH}"
    variants = [dict(base, horovod="0.28.2"), dict(base, torch="2.14.1"), dict(base, python="3.12"),
                dict(base, cuda="12.8"), dict(base, cuda="12.8", nccl=True)]
    keys = {plan.cache_key(**variant) for variant in variants}
    assert len(keys) == len(variants) and key not in keys
    assert all("/" not in k for k in keys)


def test_check_build_parsing_on_the_real_install():
    out = subprocess.run([str(Path(sys.executable).parent / "horovodrun"), "--check-build"],
                         capture_output=True, text=True, check=True).stdout
    built = plan.parse_check_build(out)
    assert built["PyTorch"] and built["MPI"] and built["Gloo"]
    assert built["TensorFlow"] is False


def test_check_build_counts_a_name_only_if_every_line_is_checked():
    out = "[X] PyTorch\n[X] MPI\n[ ] Gloo\n[ ] MPI\n[X] Gloo\n"
    assert plan.parse_check_build(out) == {"PyTorch": True, "MPI": False, "Gloo": False}


def test_missing_tools_names_each_absent_command():
    present = {"cmake", "mpirun"}
    missing = plan.missing_tools(which=lambda tool: f"/usr/bin/{tool}" if tool in present else None)
    assert missing == ["mpicxx", "g++", "patch"]


def test_no_compiler_stops_with_the_packages_to_install(tmp_path):
    """PATH without mpicxx/cmake/g++: a one-line message naming the Debian packages, exit 1."""
    env = dict(os.environ, PATH=str(tmp_path))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts/install_horovod.py"), "--force",
                           "--no-apt", "--cache-dir", str(tmp_path / "cache")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("install-horovod: error: missing mpicxx, mpirun, cmake, g++")
    assert "libopenmpi-dev" in error and "g++" in error
    assert not list((tmp_path / "cache").glob("wheels/*/*.whl"))


def test_no_network_to_the_registry_is_a_clear_error(tmp_path, monkeypatch):
    # A closed loopback port stands in for an unreachable index; nothing leaves this machine.
    for key, value in {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_EXTRA_INDEX_URL": "",
                       "PIP_FIND_LINKS": "", "PIP_RETRIES": "0", "PIP_TIMEOUT": "3",
                       "PIP_CONFIG_FILE": os.devnull}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(plan.InstallError, match="could not download horovod==0.28.1 .no network"):
        build.download_sdist(sys.executable, tmp_path, tmp_path / "log")


def test_bad_torch_spec_leaves_no_venv_claiming_success(tmp_path):
    venv = tmp_path / "venv"
    env = dict(os.environ, VENV=str(venv), TORCH_SPEC="torch==0.0.1", PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(ROOT / "scripts/setup-env")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "pip could not install 'torch==0.0.1'" in proc.stderr
    assert "TORCH_SPEC" in proc.stderr
    assert not venv.exists(), "a half-made venv was left behind"


def test_missing_test_tools_only_warn_and_name_the_package(tmp_path, capsys):
    """No sshd, no Slurm and no apt: the build goes on, and the note names the packages the skipped tests want."""
    missing = toolchain.ensure_test_tools(tmp_path / "log", use_apt=False, which=lambda tool: None)
    assert missing == list(plan.TEST_TOOLS)
    assert "/usr/sbin/sshd" in missing and "/usr/sbin/slurmctld" in missing and "/usr/sbin/munged" in missing
    note = capsys.readouterr().out
    assert "openssh-server" in note and "slurm-wlm" in note and "munge" in note
    assert note.count("slurm-wlm") == 1, note


def test_present_test_tools_install_nothing(tmp_path, capsys):
    assert toolchain.ensure_test_tools(tmp_path / "log", use_apt=True, which=lambda tool: tool) == []
    assert capsys.readouterr().out == ""


def test_a_cached_wheel_that_does_not_verify_is_dropped_and_rebuilt(tmp_path, monkeypatch, capsys):
    """E.g. a wheel copied into an image from a host whose MPI differs: not fatal, it is rebuilt."""
    key = plan.cache_key(plan.HOROVOD_VERSION, "2.13.0+cpu", ".".join(map(str, sys.version_info[:2])), None, False)
    cached = tmp_path / "wheels" / key / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
    cached.parent.mkdir(parents=True)
    cached.write_text("not really a wheel")
    monkeypatch.setattr(build, "probe_torch", lambda python: ("2.13.0+cpu", None))
    monkeypatch.setattr(build, "installed_matches", lambda python, torch: False)
    monkeypatch.setattr(build, "install_wheel", lambda python, wheel, log: None)

    def broken(python, expected=plan.EXPECTED_BUILD):
        raise plan.InstallError("horovodrun --check-build is missing MPI:\n[ ] MPI")

    def rebuilding(python, dest, log, cache=None):
        raise plan.InstallError("reached the rebuild")

    monkeypatch.setattr(build, "verify", broken)
    monkeypatch.setattr(build, "ensure_system_tools", lambda log, use_apt=True: None)
    monkeypatch.setattr(build, "download_sdist", rebuilding)
    with pytest.raises(plan.InstallError, match="reached the rebuild"):
        build.install(sys.executable, tmp_path, force=False, use_apt=False, test_tools=False)
    assert not cached.exists()
    out = capsys.readouterr().out
    assert "the cached wheel does not work here (horovodrun --check-build is missing MPI:)" in out
    assert "sshd" not in out          # test_tools=False: no note about tools only tests need


@pytest.mark.parametrize("data_filter", [True, False])
def test_source_archive_extraction_refuses_members_outside_the_folder(tmp_path, data_filter):
    """Both paths: tarfile's 'data' filter, and the check used where Python lacks it (Debian 12's 3.11.2)."""
    import io
    import tarfile

    def archive(name: str, *members: tarfile.TarInfo) -> Path:
        path = tmp_path / name
        with tarfile.open(path, "w:gz") as tar:
            for member in members:
                tar.addfile(member, io.BytesIO(b"x" * member.size) if member.isfile() else None)
        return path

    good = tarfile.TarInfo("horovod-0.28.1/setup.py")
    good.size = 1
    inside = tarfile.TarInfo("horovod-0.28.1/link")
    inside.type, inside.linkname = tarfile.SYMTYPE, "setup.py"
    dest = tmp_path / "ok"
    dest.mkdir()
    build.extract_archive(archive("good.tar.gz", good, inside), dest, data_filter=data_filter)
    assert (dest / "horovod-0.28.1/setup.py").read_bytes() == b"x"
    escape = tarfile.TarInfo("../escape.txt")
    escape.size = 1
    link = tarfile.TarInfo("horovod-0.28.1/evil")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    for bad in (escape, link):
        dest = tmp_path / f"bad-{bad.name.replace('/', '_')}"
        dest.mkdir()
        with pytest.raises((plan.InstallError, tarfile.TarError)):
            build.extract_archive(archive(f"{dest.name}.tar.gz", bad), dest, data_filter=data_filter)
        assert not (tmp_path / "escape.txt").exists()


def test_cache_key_includes_the_cuda_architectures():
    base = dict(horovod="0.28.1", torch="2.13.0", python="3.12", cuda="13.0", nccl=True)
    assert plan.cache_key(**base) == f"horovod-0.28.1-torch2.13.0-py3.12-cu13.0-nccl-p{plan.PATCH_SET_HASH}"
    assert plan.cache_key(**base, cc_list="90, 80") == (
        f"horovod-0.28.1-torch2.13.0-py3.12-cu13.0-nccl-cc80_90-p{plan.PATCH_SET_HASH}")
    assert plan.cache_key(**base, cc_list="80,90") == plan.cache_key(**base, cc_list="90,80")
    assert plan.cache_key(**base, cc_list="90") != plan.cache_key(**base, cc_list="80,90")
    assert plan.cache_key(**dict(base, cuda=None, nccl=False), cc_list="90").endswith(
        f"-cpu-p{plan.PATCH_SET_HASH}")  # no GPU code: no arch


def test_find_nccl_beyond_two_fixed_folders():
    def only(*paths):
        return lambda path: path in paths

    assert toolchain.find_nccl({}, only("/usr/include/nccl.h", "/usr/lib/x86_64-linux-gnu/libnccl.so")) == {
        "HOROVOD_NCCL_INCLUDE": "/usr/include", "HOROVOD_NCCL_LIB": "/usr/lib/x86_64-linux-gnu"}
    static = only("/sw/nccl/include/nccl.h", "/sw/nccl/lib/libnccl_static.a")
    assert toolchain.find_nccl({"NCCL_HOME": "/sw/nccl"}, static) == {
        "HOROVOD_NCCL_INCLUDE": "/sw/nccl/include", "HOROVOD_NCCL_LIB": "/sw/nccl/lib"}
    assert toolchain.find_nccl({"CUDA_HOME": "/opt/cuda"},
                               only("/opt/cuda/include/nccl.h", "/opt/cuda/lib64/libnccl.so"))
    assert toolchain.find_nccl({}, only("/usr/include/nccl.h")) is None          # a header without its library
    assert toolchain.find_nccl({"HOROVOD_NCCL_HOME": "/x"}, only()) == {}           # the user's word wins


def test_a_cuda_torch_requires_nccl_in_the_build_check():
    assert plan.expected_build(None, False) == ("PyTorch", "MPI", "Gloo")
    assert plan.expected_build("13.0", True) == ("PyTorch", "MPI", "Gloo", "NCCL")
    assert "libnccl-dev" in plan.NCCL_MISSING and "HVDTRAIN_ALLOW_NO_NCCL=1" in plan.NCCL_MISSING
    assert build.build_env("13.0", True, {"HOROVOD_NCCL_LIB": "/l"})["HOROVOD_NCCL_LIB"] == "/l"


def test_cuda_torch_on_a_gpu_host_without_nccl_stops_before_building(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "probe_torch", lambda python: ("2.13.0", "13.0"))
    monkeypatch.setattr(toolchain, "find_nccl", lambda environ: None)
    monkeypatch.setattr(toolchain, "find_nccl_wheel", lambda sites: None)
    monkeypatch.setattr(toolchain, "gpu_compute_caps", lambda: ["9.0"])
    monkeypatch.delenv("HVDTRAIN_ALLOW_NO_NCCL", raising=False)
    monkeypatch.delenv("HVDTRAIN_HOROVOD_GPU", raising=False)
    with pytest.raises(plan.InstallError, match="CUDA 13.0 build and this machine has a GPU, but the GPU build of "
                                              "Horovod lacks NCCL"):
        build.install(sys.executable, tmp_path, force=False, use_apt=False, test_tools=False)


def test_cuda_torch_on_a_machine_without_gpu_builds_for_cpu_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(toolchain, "gpu_compute_caps", lambda: [])
    monkeypatch.delenv("HVDTRAIN_HOROVOD_GPU", raising=False)
    monkeypatch.delenv("HOROVOD_GPU_OPERATIONS", raising=False)
    assert toolchain.plan_gpu_build(sys.executable, "13.0", {}, tmp_path) == (
        None, False, {"HVDTRAIN_HOROVOD_CPU_ONLY": "1"})
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["[install-horovod] " + plan.cpu_on_cuda_torch_note("13.0")]
    # ... and its wheel never shares a cache folder with a CPU torch's or a GPU build's.
    keys = {plan.cache_key("0.28.1", "2.13.0", "3.11", None, False, torch_cuda="13.0"),
            plan.cache_key("0.28.1", "2.13.0", "3.11", None, False),
            plan.cache_key("0.28.1", "2.13.0", "3.11", "13.0", True)}
    assert len(keys) == 3


@pytest.mark.parametrize(("environ", "caps", "wanted"), [
    ({}, [], False), ({}, ["8.0"], True), ({"HVDTRAIN_HOROVOD_GPU": "1"}, [], True),
    ({"HVDTRAIN_HOROVOD_GPU": "0"}, ["9.0"], False), ({"HOROVOD_GPU_OPERATIONS": "NCCL"}, [], True)])
def test_gpu_build_is_wanted_where_a_gpu_is_or_where_asked(environ, caps, wanted):
    assert plan.gpu_wanted(environ, caps) is wanted


# What the real nvcc prints for `nvcc -v <input>` before it looks at its input: its nvcc.profile settings, on stderr.
FAKE_NVCC = """#!/bin/sh
here=$(cd "$(dirname "$0")" && pwd)
echo "#\\$ _NVVM_BRANCH_=nvvm" >&2
echo "#\\$ _HERE_=$here" >&2
echo "#\\$ _THERE_=$here" >&2
echo "#\\$ TOP=$here/.." >&2
echo "#\\$ INCLUDES=\\"-I$here/../targets/x86_64-linux/include\\"" >&2
echo "nvcc fatal   : Don't know what to do with '$2'" >&2
exit 1
"""


def fake_toolkit(root: Path) -> Path:
    """A CUDA toolkit's layout (targets/x86_64-linux/include with include/ linking to it, as the .run and .deb
    installers lay it out) whose bin/nvcc is a script printing what the real nvcc prints for `nvcc -v`. No CUDA
    exists on this machine: the fixture stands in for the toolkit's files only, to exercise the path finding."""
    headers = root / "targets" / "x86_64-linux" / "include"
    headers.mkdir(parents=True)
    (headers / "cuda_runtime.h").write_text("#pragma once\n")
    (root / "include").symlink_to(headers)
    (root / "bin").mkdir()
    (root / "bin" / "nvcc").write_text(FAKE_NVCC)
    (root / "bin" / "nvcc").chmod(0o755)
    return root


def on_path(folder: Path):
    return lambda name: shutil.which(name, path=str(folder))


def test_a_wrapper_script_nvcc_on_path_leads_to_the_toolkit_it_runs(tmp_path):
    """/usr/local/bin/nvcc -> `exec /usr/local/cuda-13.0/bin/nvcc "$@"` (conda, environment modules, some images):
    its own folder holds no toolkit, which is where CMake's FindCUDAToolkit stopped (missing CUDAToolkit_INCLUDE_DIR
    CUDA_CUDART). The toolkit is the one the wrapper's nvcc reports, and the build is pointed at it."""
    root = fake_toolkit(tmp_path / "cuda-13.0")
    wrappers = tmp_path / "usr-local-bin"
    wrappers.mkdir()
    (wrappers / "nvcc").write_text(f'#!/bin/sh\nexec {root}/bin/nvcc "$@"\n')
    (wrappers / "nvcc").chmod(0o755)
    assert not toolchain.is_toolkit(str((wrappers / "nvcc").resolve().parent.parent))    # what CMake looked at
    found = toolchain.find_cuda_toolkit({}, [], which=on_path(wrappers))
    assert found == (str(root), f"the folder the nvcc on PATH ({wrappers / 'nvcc'}) reports")
    assert toolchain.toolkit_env(str(root), {}) == {"HOROVOD_CUDA_HOME": str(root), "CUDA_HOME": str(root),
                                                    "CUDAToolkit_ROOT": str(root), "CUDACXX": f"{root}/bin/nvcc"}
    assert "CUDACXX" not in toolchain.toolkit_env(str(root), {"CUDACXX": str(wrappers / "nvcc")})   # the user's


def test_the_cuda_toolkit_comes_from_the_users_word_then_nvcc_then_the_usual_places(tmp_path):
    root = fake_toolkit(tmp_path / "cuda-12.8")
    links = tmp_path / "bin"
    links.mkdir()
    (links / "nvcc").symlink_to(root / "bin" / "nvcc")       # Debian's alternatives: a symlink, resolved
    assert toolchain.find_cuda_toolkit({}, [], which=on_path(links)) == (str(root), f"nvcc on PATH ({links}/nvcc)")
    other = fake_toolkit(tmp_path / "cuda-13.0")
    for name in ("CUDA_HOME", "CUDA_PATH", "CUDAToolkit_ROOT", "HOROVOD_CUDA_HOME"):
        assert toolchain.find_cuda_toolkit({name: str(other)}, [], which=on_path(links)) == (str(other), name)
    assert toolchain.find_cuda_toolkit({"CUDA_HOME": str(tmp_path / "none")}, [], which=on_path(links))[0] == str(root)
    wheel_nvcc = tmp_path / "site" / "nvidia" / "cuda_nvcc" / "bin" / "nvcc"
    wheel_nvcc.parent.mkdir(parents=True)
    wheel_nvcc.write_text("")
    not_usr = lambda path: os.path.exists(path) and not path.startswith("/usr/")   # noqa: E731
    assert toolchain.find_cuda_toolkit({}, [str(tmp_path / "site")], which=on_path(tmp_path / "empty"),
                                       exists=not_usr) == (str(wheel_nvcc.parent.parent), "the nvidia-cuda-nvcc wheel")
    assert toolchain.find_cuda_toolkit({}, [], which=on_path(tmp_path / "empty"), exists=not_usr) is None
    assert plan.nvcc_wheel("12.8") == "nvidia-cuda-nvcc-cu12==12.8.*"
    assert plan.nvcc_wheel("13.0") == "nvidia-cuda-nvcc==13.0.*"


def test_only_the_architectures_of_the_gpus_present_are_compiled():
    assert plan.cc_list_of(["9.0", "8.0", "9.0"]) == "80,90"
    assert plan.cc_list_of(["[N/A]", ""]) == ""


def test_gpu_build_names_everything_missing_in_one_line():
    message = plan.gpu_missing_message("12.8", [plan.NCCL_MISSING, plan.nvcc_missing("12.8")])
    assert "\n" not in message and "NCCL" in message and "nvidia-cuda-nvcc-cu12==12.8.*" in message
    assert "HVDTRAIN_HOROVOD_GPU=0" in message


def test_bundled_gloo_configures_with_cmake_4(tmp_path):
    """PyPI's cmake is 4.x, which refuses cmake_minimum_required(2.8.12) (gloo's) without the policy minimum."""
    target = tmp_path / "cmake4"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(target), "cmake>=4,<5"],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.skip(f"cmake 4 could not be installed from the package index: {proc.stderr.strip()[-200:]}")
    cmake = target / "bin" / "cmake"
    project = tmp_path / "old"
    project.mkdir()
    (project / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 2.8.12 FATAL_ERROR)\nproject(g NONE)\n")
    env = dict(os.environ, PYTHONPATH=str(target))
    env.pop("CMAKE_POLICY_VERSION_MINIMUM", None)
    refused = subprocess.run([str(cmake), "-S", str(project), "-B", str(tmp_path / "b1")], env=env,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "Compatibility with CMake < 3.5 has been removed" in refused.stderr
    build_env = build.build_env(None, False)
    assert build_env["CMAKE_POLICY_VERSION_MINIMUM"] == "3.5"
    accepted = subprocess.run([str(cmake), "-S", str(project), "-B", str(tmp_path / "b2")],
                              env=dict(env, CMAKE_POLICY_VERSION_MINIMUM=build_env["CMAKE_POLICY_VERSION_MINIMUM"]),
                              capture_output=True, text=True, timeout=120)
    assert accepted.returncode == 0, accepted.stderr


def test_an_installed_horovod_without_nccl_is_rebuilt_once_nccl_is_there(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(build, "probe_torch", lambda python: ("2.13.0", "13.0"))
    nccl = {"HOROVOD_NCCL_INCLUDE": "/i", "HOROVOD_NCCL_LIB": "/l"}
    monkeypatch.setattr(toolchain, "find_nccl", lambda environ: nccl)
    monkeypatch.setattr(toolchain, "find_cuda_toolkit", lambda environ, sites: ("/usr/local/cuda", "CUDA_HOME"))
    monkeypatch.setattr(toolchain, "gpu_compute_caps", lambda: ["9.0"])
    monkeypatch.setattr(build, "installed_matches", lambda python, torch: True)
    checked = []

    def verify(python, expected=plan.EXPECTED_BUILD):
        checked.append(expected)
        raise plan.InstallError("horovodrun --check-build is missing NCCL:")

    def stop(*_args, **_kw):
        raise plan.InstallError("stop before building")

    monkeypatch.setattr(build, "verify", verify)
    monkeypatch.setattr(build, "ensure_system_tools", stop)
    with pytest.raises(plan.InstallError, match="stop before building"):
        build.install(sys.executable, tmp_path, force=False, use_apt=False, test_tools=False)
    assert checked == [("PyTorch", "MPI", "Gloo", "NCCL")]
    out = capsys.readouterr().out
    assert "is missing NCCL:); rebuilding" in out
    assert "GPU build: CUDA 13.0, toolkit /usr/local/cuda (from CUDA_HOME)" in out      # says which toolkit


def test_an_installed_horovod_built_against_another_torch_is_not_a_match(tmp_path, monkeypatch):
    """After a torch upgrade (2.13 -> 2.15) Horovod still imported, so set-up called it 'already installed';
    only its metadata.json names the torch it was compiled with. A copy of the real package, saying 2.15."""
    import shutil

    import horovod
    import torch

    assert build.installed_matches(sys.executable, torch.__version__)          # this venv's own build
    copy = tmp_path / "horovod"
    shutil.copytree(Path(horovod.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert build.installed_matches(sys.executable, torch.__version__)          # the copy imports and matches
    other = "2.15.0+cu132" if torch.__version__ != "2.15.0+cu132" else "2.13.0+cu130"
    (copy / "metadata.json").write_text(f'{{"pytorch": "{other}", "dummy": "none"}}')
    assert not build.installed_matches(sys.executable, torch.__version__)      # built for another torch: rebuild


@pytest.mark.parametrize("name", ["IDLE_ENV", "EXCHANGE_ENV"])
def test_an_installed_horovod_without_the_perf_patches_is_not_a_match(tmp_path, monkeypatch, name):
    """A wheel built before patch 0008 or 0009 landed imports and has the bf16 binding, yet ignores
    HOROVOD_IDLE_CYCLE_TIME or HOROVOD_EXCHANGE_ALLREDUCE: set-up must rebuild it. A copy of the real package whose
    extension lacks the name."""
    import shutil

    import horovod
    import torch

    copy = tmp_path / "horovod"
    shutil.copytree(Path(horovod.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    lib = next((copy / "torch").glob("mpi_lib_v2*.so"))
    data = lib.read_bytes()
    variable = getattr(plan, name).encode()
    assert variable in data and build.installed_matches(sys.executable, torch.__version__)
    lib.write_bytes(data.replace(variable, b"HOROVOD_XX" + b"X" * (len(variable) - 10)))   # same length: still loads
    assert not build.installed_matches(sys.executable, torch.__version__)


