"""The Horovod build script: its pure parts, and its failures (each a clear message, nothing claimed)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import install_horovod as ih
import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_parse_version_handles_local_and_pre_release_tags():
    assert ih.parse_version("2.13.0+cpu") == (2, 13, 0)
    assert ih.parse_version("2.1.0a0+git1234") == (2, 1, 0)
    assert ih.parse_version("1.13") == (1, 13, 0)
    with pytest.raises(ih.InstallError, match="cannot parse version"):
        ih.parse_version("nightly")


@pytest.mark.parametrize("torch_version, expected", [
    ("2.0.1", False), ("1.13.1+cu117", False), ("2.1.0", True), ("2.13.0+cpu", True), ("3.0.0", True)])
def test_cxx17_fix_needed_from_torch_2_1(torch_version, expected):
    assert ih.needs_cxx17(torch_version) is expected


def test_cache_key_changes_with_every_build_input():
    base = dict(horovod="0.28.1", torch="2.13.0+cpu", python="3.11", cuda=None, nccl=False)
    key = ih.cache_key(**base)
    assert key == f"horovod-0.28.1-torch2.13.0_cpu-py3.11-cpu-p{ih.PATCH_SET_HASH}"
    variants = [dict(base, horovod="0.28.2"), dict(base, torch="2.14.1"), dict(base, python="3.12"),
                dict(base, cuda="12.8"), dict(base, cuda="12.8", nccl=True)]
    keys = {ih.cache_key(**variant) for variant in variants}
    assert len(keys) == len(variants) and key not in keys
    assert all("/" not in k for k in keys)


@pytest.fixture(scope="module")
def horovod_sdist(tmp_path_factory):
    """The real horovod 0.28.1 sdist, downloaded with pip and unpacked once: never patched itself."""
    dest = tmp_path_factory.mktemp("sdist")
    log = dest / "download.log"
    return ih.download_sdist(sys.executable, dest, log)


@pytest.fixture
def horovod_source(horovod_sdist, tmp_path):
    """A fresh copy of the unpacked sdist for each test: a patch one test applies is not there for the next, in
    any order (33 MB, about a second)."""
    return Path(shutil.copytree(horovod_sdist, tmp_path / "horovod-src", symlinks=True))


PATCH_SETS = {   # name: (the patches, the function that applies them, the marker each patched file carries once)
    "cxx17": (ih.PATCHES, ih.apply_cxx17_fix, ih.CXX17_MARKER),
    "bf16": (ih.BF16_PATCHES, ih.apply_bf16, ih.BF16_MARKER),
    "idle-cycles": (ih.PERF_PATCHES, ih.apply_perf, ih.PERF_MARKER),
}


@pytest.mark.parametrize("name", sorted(PATCH_SETS))
def test_each_patch_set_applies_exactly_once_to_the_real_sources(horovod_source, name):
    patches, apply, marker = PATCH_SETS[name]
    files = [horovod_source / rel for rel in patches]
    originals = [f.read_text() for f in files]
    assert apply(horovod_source) is True
    patched = [f.read_text() for f in files]
    assert apply(horovod_source) is False
    assert [f.read_text() for f in files] == patched
    for path, before, after in zip(files, originals, patched, strict=True):
        assert marker in after and after != before, path
    if name == "cxx17":
        assert all(after.count(marker) == 1 for after in patched)
        torch_cmake = (horovod_source / "horovod/torch/CMakeLists.txt").read_text()
        assert "set(CMAKE_CXX_STANDARD 17)" in torch_cmake
        assert "list(APPEND PYTORCH_LINKER_LIBS compatible17_gloo)" in torch_cmake
        top = (horovod_source / "CMakeLists.txt").read_text()
        assert "Pytorch_CXX17 AND Pytorch_CXX17" in top
        # the C++11 gloo only where a target links it (none with torch >= 2.1 alone): a third of the compile
        assert "add_subdirectory(third_party/gloo EXCLUDE_FROM_ALL)" in top
    elif name == "bf16":
        assert all(after.count(marker) == 1 for after in patched)
        assert "HOROVOD_BFLOAT16 = 10," in (horovod_source / "horovod/common/message.h").read_text()
        bindings = (horovod_source / "horovod/torch/mpi_ops_v2.cc").read_text()
        # 8 operations, each for CPU tensors and for CUDA ones (on the GPU or staged through host memory)
        assert bindings.count('_BFloat16Tensor", &Do') == 8 * 3 and f'"{ih.BF16_BINDING}"' in bindings
    else:
        queue = (horovod_source / "horovod/common/tensor_queue.cc").read_text()
        assert queue.count("enqueued_.notify_one();") == 2   # both ways in: one tensor, a grouped list
        operations = (horovod_source / "horovod/common/operations.cc").read_text()
        assert '"HOROVOD_IDLE_CYCLE_TIME"' in operations and "WaitWhileIdle(" in operations


def test_cache_key_changes_with_the_patch_set():
    """A wheel built before a patch changed (or before the bf16 patch existed) is never reused."""
    base = dict(horovod="0.28.1", torch="2.13.0+cpu", python="3.11", cuda=None, nccl=False)
    assert ih.cache_key(**base) == ih.cache_key(**base, patches=ih.PATCH_SET_HASH)
    assert ih.cache_key(**base) != "horovod-0.28.1-torch2.13.0_cpu-py3.11-cpu"   # the key before the bf16 patch
    rel = "horovod/common/message.h"
    edited = dict(ih.BF16_PATCHES, **{rel: ((ih.BF16_PATCHES[rel][0][0], ih.BF16_PATCHES[rel][0][1] + " "),)})
    other = ih.patch_set_hash(ih.PATCHES, ih.HEADER_PATCHES, edited)
    assert other != ih.PATCH_SET_HASH and ih.cache_key(**base, patches=other) != ih.cache_key(**base)
    assert (ih.patch_set_hash(ih.PATCHES, ih.HEADER_PATCHES, ih.BF16_PATCHES, ih.PERF_PATCHES) + ih.series_hash()
            == ih.PATCH_SET_HASH)


def test_the_patch_series_applies_exactly_and_is_part_of_the_cache_key(tmp_path):
    """scripts/horovod/patches: real unified diffs, in the series' order, with no fuzz; a changed diff, a new patch
    or another order gives another wheel (a reworded header does not)."""
    names = [path.name for path in ih.series()]
    assert names and all(name[:4].isdigit() and name.endswith(".patch") for name in names) and names == sorted(names)
    for path in ih.series():
        head = path.read_text().split("\n---\n", 1)[0]
        for part in ("Why:", "Upstream:", "Depends on it:", "Switched on by:"):
            assert part in head, (path.name, part)
    copy = tmp_path / "patches"
    shutil.copytree(ih.PATCH_DIR, copy)
    assert ih.series_hash(copy) == ih.series_hash()
    first = copy / names[0]
    first.write_text(first.read_text().replace("Why:", "Why (reworded):", 1))
    assert ih.series_hash(copy) == ih.series_hash()            # a header only explains
    first.write_text(first.read_text() + "+\n")
    assert ih.series_hash(copy) != ih.series_hash()            # the diff is what is built
    shutil.copy2(ih.PATCH_DIR / names[0], first)
    (copy / "series").write_text("\n".join(reversed(names)) + "\n")
    assert ih.series_hash(copy) != ih.series_hash()
    # A tree the patches do not fit: one line naming the patch, never a half-patched build.
    tree = tmp_path / "src"
    (tree / "horovod/runner/elastic").mkdir(parents=True)
    (tree / "horovod/runner/elastic/worker.py").write_text("not horovod 0.28.1\n")
    with pytest.raises(ih.InstallError, match=names[0]):
        ih.apply_series(tree)


@pytest.mark.skipif(not ih.shutil.which("g++"), reason="needs g++ to compile the patched header")
def test_patched_half_header_rounds_bf16_as_torch_does(horovod_source, tmp_path):
    """The bf16 helpers compiled for real (strict C++17) and run on float32 bit patterns, against torch."""
    import torch

    ih.apply_bf16(horovod_source)
    generator = torch.Generator().manual_seed(0)
    bits = torch.randint(-2 ** 31, 2 ** 31 - 1, (20000,), dtype=torch.int64, generator=generator).to(torch.int32)
    special = torch.tensor([0.0, -0.0, 1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 3.3895e38, float("inf"), -float("inf"),
                            1e-40, -1e-45, float("nan")], dtype=torch.float32)
    values = torch.cat([bits.view(torch.float32), special])
    (tmp_path / "in.bin").write_bytes(values.numpy().tobytes())
    unit = tmp_path / "unit.cc"
    unit.write_text('#include "half.h"\n#include <cstdio>\nusing namespace horovod::common;\n'
                    "int main() {\n  FILE* in = std::fopen(\"in.bin\", \"rb\");\n"
                    "  FILE* out = std::fopen(\"out.bin\", \"wb\");\n"
                    "  float v;\n  while (std::fread(&v, 4, 1, in) == 1) {\n"
                    "    uint16_t b = FloatToBFloat16Bits(v);\n    std::fwrite(&b, 2, 1, out);\n"
                    "    float back = BFloat16BitsToFloat(b);\n    uint16_t again = FloatToBFloat16Bits(back);\n"
                    "    if (again != b) return 2;\n  }\n"
                    "  BFloat16 one{0x3f80}, three{0x4040};\n"
                    "  if ((one + one).bits != 0x4000 || (three * three).bits != 0x4110 || !(one < three)) return 3;\n"
                    "  std::fclose(in); std::fclose(out); return 0;\n}\n")
    built = subprocess.run(["g++", "-std=c++17", "-pedantic-errors", "-O1", f"-I{horovod_source / 'horovod/common'}",
                            str(unit), "-o", str(tmp_path / "unit")], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    ran = subprocess.run([str(tmp_path / "unit")], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran
    got = torch.frombuffer(bytearray((tmp_path / "out.bin").read_bytes()), dtype=torch.int16)
    want = values.to(torch.bfloat16).view(torch.int16)
    nan = torch.isnan(values)
    assert torch.equal(got[~nan], want[~nan])
    assert torch.isnan(got[nan].view(torch.bfloat16)).all()      # a NaN stays a NaN (its payload may differ)


def test_patch_refuses_sources_without_the_expected_anchor():
    with pytest.raises(ih.InstallError, match="expected the anchor once, found it 0 times"):
        ih.patch_text("cmake_minimum_required(VERSION 3.13)\n", ih.PATCHES["CMakeLists.txt"], "CMakeLists.txt")


def test_check_build_parsing_on_the_real_install():
    out = subprocess.run([str(Path(sys.executable).parent / "horovodrun"), "--check-build"],
                         capture_output=True, text=True, check=True).stdout
    built = ih.parse_check_build(out)
    assert built["PyTorch"] and built["MPI"] and built["Gloo"]
    assert built["TensorFlow"] is False


def test_check_build_counts_a_name_only_if_every_line_is_checked():
    out = "[X] PyTorch\n[X] MPI\n[ ] Gloo\n[ ] MPI\n[X] Gloo\n"
    assert ih.parse_check_build(out) == {"PyTorch": True, "MPI": False, "Gloo": False}


def test_missing_tools_names_each_absent_command():
    present = {"cmake", "mpirun"}
    missing = ih.missing_tools(which=lambda tool: f"/usr/bin/{tool}" if tool in present else None)
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
    with pytest.raises(ih.InstallError, match="could not download horovod==0.28.1 .no network"):
        ih.download_sdist(sys.executable, tmp_path, tmp_path / "log")


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
    missing = ih.ensure_test_tools(tmp_path / "log", use_apt=False, which=lambda tool: None)
    assert missing == list(ih.TEST_TOOLS)
    assert "/usr/sbin/sshd" in missing and "/usr/sbin/slurmctld" in missing and "/usr/sbin/munged" in missing
    note = capsys.readouterr().out
    assert "openssh-server" in note and "slurm-wlm" in note and "munge" in note
    assert note.count("slurm-wlm") == 1, note


def test_present_test_tools_install_nothing(tmp_path, capsys):
    assert ih.ensure_test_tools(tmp_path / "log", use_apt=True, which=lambda tool: tool) == []
    assert capsys.readouterr().out == ""


def test_a_cached_wheel_that_does_not_verify_is_dropped_and_rebuilt(tmp_path, monkeypatch, capsys):
    """E.g. a wheel copied into an image from a host whose MPI differs: not fatal, it is rebuilt."""
    key = ih.cache_key(ih.HOROVOD_VERSION, "2.13.0+cpu", ".".join(map(str, sys.version_info[:2])), None, False)
    cached = tmp_path / "wheels" / key / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
    cached.parent.mkdir(parents=True)
    cached.write_text("not really a wheel")
    monkeypatch.setattr(ih, "probe_torch", lambda python: ("2.13.0+cpu", None))
    monkeypatch.setattr(ih, "installed_matches", lambda python, torch: False)
    monkeypatch.setattr(ih, "install_wheel", lambda python, wheel, log: None)

    def broken(python, expected=ih.EXPECTED_BUILD):
        raise ih.InstallError("horovodrun --check-build is missing MPI:\n[ ] MPI")

    def rebuilding(python, dest, log):
        raise ih.InstallError("reached the rebuild")

    monkeypatch.setattr(ih, "verify", broken)
    monkeypatch.setattr(ih, "ensure_system_tools", lambda log, use_apt=True: None)
    monkeypatch.setattr(ih, "download_sdist", rebuilding)
    with pytest.raises(ih.InstallError, match="reached the rebuild"):
        ih.install(sys.executable, tmp_path, force=False, use_apt=False, test_tools=False)
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
    ih.extract_archive(archive("good.tar.gz", good, inside), dest, data_filter=data_filter)
    assert (dest / "horovod-0.28.1/setup.py").read_bytes() == b"x"
    escape = tarfile.TarInfo("../escape.txt")
    escape.size = 1
    link = tarfile.TarInfo("horovod-0.28.1/evil")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    for bad in (escape, link):
        dest = tmp_path / f"bad-{bad.name.replace('/', '_')}"
        dest.mkdir()
        with pytest.raises((ih.InstallError, tarfile.TarError)):
            ih.extract_archive(archive(f"{dest.name}.tar.gz", bad), dest, data_filter=data_filter)
        assert not (tmp_path / "escape.txt").exists()


# Standard names 0.28.1's patched headers use, and the header g++ 13's libstdc++ needs included for each.
STD_NAMES = {r"\bu?int(8|16|32|64)_t\b": "<cstdint>", r"\bstd::string\b": "<string>",
             r"\bstd::(logic_error|runtime_error|invalid_argument)\b": "<stdexcept>"}


def undeclared(text: str) -> set[str]:
    """The standard headers a file uses names from without including them itself."""
    import re

    return {header for pattern, header in STD_NAMES.items()
            if re.search(pattern, text) and f"#include {header}" not in text}


def test_gcc13_fix_adds_the_includes_the_headers_rely_on(horovod_source):
    """horovod#3957: g++ 13 no longer brings these in through <mutex>/<vector>/<string>."""
    files = {rel: (horovod_source / rel).read_text() for rel in ih.HEADER_PATCHES}
    assert undeclared(files["horovod/common/group_table.h"]) == {"<cstdint>", "<string>"}
    assert "<stdexcept>" in undeclared(files["horovod/common/common.h"])
    assert ih.apply_gcc13_fix(horovod_source) is True
    assert ih.apply_gcc13_fix(horovod_source) is False
    for rel, before in files.items():
        after = (horovod_source / rel).read_text()
        assert after.count(ih.GCC13_MARKER) == 1 and undeclared(after) == set(), rel
        assert after.replace(ih.GCC13_MARKER + "\n", "").count("#include") > before.count("#include")


@pytest.mark.skipif(not ih.shutil.which("g++"), reason="needs g++ to compile the patched headers")
@pytest.mark.parametrize("header", sorted(ih.HEADER_PATCHES))
def test_patched_headers_compile_alone_as_strict_cxx17(horovod_source, header, tmp_path):
    """Each patched header first and alone in a TU, ISO C++17 with pedantic errors (the strictest check
    here: this machine's g++ is 12, whose libstdc++ still includes more transitively than 13's, so the
    include check above is what proves the g++ 13 fix; this proves the patched headers are valid C++17)."""
    ih.apply_gcc13_fix(horovod_source)
    unit = tmp_path / "unit.cc"
    unit.write_text(f'#include "{Path(header).name}"\nint main() {{ return 0; }}\n')
    proc = subprocess.run(["g++", "-std=c++17", "-pedantic-errors", "-fsyntax-only",
                           f"-I{horovod_source / Path(header).parent}", str(unit)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_cache_key_includes_the_cuda_architectures():
    base = dict(horovod="0.28.1", torch="2.13.0", python="3.12", cuda="13.0", nccl=True)
    assert ih.cache_key(**base) == f"horovod-0.28.1-torch2.13.0-py3.12-cu13.0-nccl-p{ih.PATCH_SET_HASH}"
    assert ih.cache_key(**base, cc_list="90, 80") == (
        f"horovod-0.28.1-torch2.13.0-py3.12-cu13.0-nccl-cc80_90-p{ih.PATCH_SET_HASH}")
    assert ih.cache_key(**base, cc_list="80,90") == ih.cache_key(**base, cc_list="90,80")
    assert ih.cache_key(**base, cc_list="90") != ih.cache_key(**base, cc_list="80,90")
    assert ih.cache_key(**dict(base, cuda=None, nccl=False), cc_list="90").endswith(
        f"-cpu-p{ih.PATCH_SET_HASH}")  # no GPU code: no arch


def test_find_nccl_beyond_two_fixed_folders():
    def only(*paths):
        return lambda path: path in paths

    assert ih.find_nccl({}, only("/usr/include/nccl.h", "/usr/lib/x86_64-linux-gnu/libnccl.so")) == {
        "HOROVOD_NCCL_INCLUDE": "/usr/include", "HOROVOD_NCCL_LIB": "/usr/lib/x86_64-linux-gnu"}
    static = only("/sw/nccl/include/nccl.h", "/sw/nccl/lib/libnccl_static.a")
    assert ih.find_nccl({"NCCL_HOME": "/sw/nccl"}, static) == {
        "HOROVOD_NCCL_INCLUDE": "/sw/nccl/include", "HOROVOD_NCCL_LIB": "/sw/nccl/lib"}
    assert ih.find_nccl({"CUDA_HOME": "/opt/cuda"}, only("/opt/cuda/include/nccl.h", "/opt/cuda/lib64/libnccl.so"))
    assert ih.find_nccl({}, only("/usr/include/nccl.h")) is None          # a header without its library
    assert ih.find_nccl({"HOROVOD_NCCL_HOME": "/x"}, only()) == {}           # the user's word wins


def test_a_cuda_torch_requires_nccl_in_the_build_check():
    assert ih.expected_build(None, False) == ("PyTorch", "MPI", "Gloo")
    assert ih.expected_build("13.0", True) == ("PyTorch", "MPI", "Gloo", "NCCL")
    assert "libnccl-dev" in ih.NCCL_MISSING and "HVDTRAIN_ALLOW_NO_NCCL=1" in ih.NCCL_MISSING
    assert ih.build_env("13.0", True, {"HOROVOD_NCCL_LIB": "/l"})["HOROVOD_NCCL_LIB"] == "/l"


def test_cuda_torch_on_a_gpu_host_without_nccl_stops_before_building(tmp_path, monkeypatch):
    monkeypatch.setattr(ih, "probe_torch", lambda python: ("2.13.0", "13.0"))
    monkeypatch.setattr(ih, "find_nccl", lambda environ: None)
    monkeypatch.setattr(ih, "find_nccl_wheel", lambda sites: None)
    monkeypatch.setattr(ih, "gpu_compute_caps", lambda: ["9.0"])
    monkeypatch.delenv("HVDTRAIN_ALLOW_NO_NCCL", raising=False)
    monkeypatch.delenv("HVDTRAIN_HOROVOD_GPU", raising=False)
    with pytest.raises(ih.InstallError, match="CUDA 13.0 build and this machine has a GPU, but the GPU build of "
                                              "Horovod lacks NCCL"):
        ih.install(sys.executable, tmp_path, force=False, use_apt=False, test_tools=False)


def test_cuda_torch_on_a_machine_without_gpu_builds_for_cpu_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ih, "gpu_compute_caps", lambda: [])
    monkeypatch.delenv("HVDTRAIN_HOROVOD_GPU", raising=False)
    monkeypatch.delenv("HOROVOD_GPU_OPERATIONS", raising=False)
    assert ih.plan_gpu_build(sys.executable, "13.0", {}, tmp_path) == (None, False, {"HVDTRAIN_HOROVOD_CPU_ONLY": "1"})
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["[install-horovod] " + ih.cpu_on_cuda_torch_note("13.0")]
    # ... and its wheel never shares a cache folder with a CPU torch's or a GPU build's.
    keys = {ih.cache_key("0.28.1", "2.13.0", "3.11", None, False, torch_cuda="13.0"),
            ih.cache_key("0.28.1", "2.13.0", "3.11", None, False),
            ih.cache_key("0.28.1", "2.13.0", "3.11", "13.0", True)}
    assert len(keys) == 3


@pytest.mark.parametrize(("environ", "caps", "wanted"), [
    ({}, [], False), ({}, ["8.0"], True), ({"HVDTRAIN_HOROVOD_GPU": "1"}, [], True),
    ({"HVDTRAIN_HOROVOD_GPU": "0"}, ["9.0"], False), ({"HOROVOD_GPU_OPERATIONS": "NCCL"}, [], True)])
def test_gpu_build_is_wanted_where_a_gpu_is_or_where_asked(environ, caps, wanted):
    assert ih.gpu_wanted(environ, caps) is wanted


def test_the_cpu_only_switch_makes_horovods_find_pytorch_call_torch_a_cpu_build(horovod_source, tmp_path):
    """The patched FindPytorch.cmake: a CUDA torch with a CUDA toolkit present is a CPU build under the switch
    (CppExtension: no cudart to link, no add_cuda()), and still a CUDA build without it."""
    ih.apply_cxx17_fix(horovod_source)   # once: other tests of this module may have applied it already
    text = (horovod_source / "cmake/Modules/FindPytorch.cmake").read_text()
    start = text.index('string(TOUPPER "${Pytorch_CUDA}" Pytorch_CUDA)')
    block = text[start:text.index("endif()", start) + len("endif()")]
    (tmp_path / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.13)\nproject(p NONE)\n"
                                             "set(Pytorch_CUDA True)\n" + block +
                                             '\nmessage(STATUS "Pytorch_CUDA=${Pytorch_CUDA}")\n')
    for switch, cuda in (("1", "FALSE"), ("", "TRUE")):
        proc = subprocess.run(["cmake", "-S", str(tmp_path), "-B", str(tmp_path / f"b{switch}")],
                              env=dict(os.environ, HVDTRAIN_HOROVOD_CPU_ONLY=switch),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert f"Pytorch_CUDA={cuda}" in proc.stdout


def _wheel_layout(site: Path) -> Path:
    """The layout of torch's nvidia-nccl wheel: the header and only the versioned library."""
    root = site / "nvidia" / "nccl"
    (root / "include").mkdir(parents=True)
    (root / "lib").mkdir()
    (root / "include" / "nccl.h").write_text("#define NCCL_MAJOR 2\n#define NCCL_VERSION_CODE 22907\n")
    (root / "lib" / "libnccl.so.2").write_bytes(b"")
    return root


def test_nccl_from_torchs_wheel_is_found_by_horovods_own_find_module(horovod_source, tmp_path):
    root = _wheel_layout(tmp_path / "site")
    found = ih.find_nccl_wheel([str(tmp_path / "empty"), str(tmp_path / "site")])
    assert found == {"HOROVOD_NCCL_INCLUDE": f"{root}/include", "HOROVOD_NCCL_LIB": f"{root}/lib",
                     "HOROVOD_NCCL_LINK": "SHARED"}
    env = ih.nccl_link_dir(found, tmp_path / "link")
    assert (tmp_path / "link" / "libnccl.so").resolve() == root / "lib" / "libnccl.so.2"
    project = tmp_path / "proj"
    project.mkdir()
    (project / "CMakeLists.txt").write_text(
        f"cmake_minimum_required(VERSION 3.13)\nproject(p NONE)\n"
        f"list(APPEND CMAKE_MODULE_PATH {horovod_source}/cmake/Modules)\nfind_package(NCCL REQUIRED)\n"
        "message(STATUS \"NCCL_LIBS=${NCCL_LIBRARIES} MAJOR=${NCCL_MAJOR_VERSION}\")\n")
    proc = subprocess.run(["cmake", "-S", str(project), "-B", str(project / "build")],
                          env=dict(os.environ, **env), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"NCCL_LIBS={tmp_path / 'link' / 'libnccl.so'} MAJOR=2" in proc.stdout
    assert ih.find_nccl_wheel([str(tmp_path / "empty")]) is None


def test_nvcc_comes_from_the_system_first_then_the_matching_wheel(tmp_path):
    wheel_nvcc = tmp_path / "site" / "nvidia" / "cuda_nvcc" / "bin" / "nvcc"
    wheel_nvcc.parent.mkdir(parents=True)
    wheel_nvcc.write_text("")
    sites = [str(tmp_path / "site")]
    assert ih.find_nvcc({}, sites, which=lambda _: None, exists=lambda p: os.path.exists(p) and "/usr" not in p) \
        == str(tmp_path / "site" / "nvidia" / "cuda_nvcc")
    assert ih.find_nvcc({"CUDA_HOME": str(tmp_path / "site/nvidia/cuda_nvcc")}, [], which=lambda _: None) \
        == str(tmp_path / "site/nvidia/cuda_nvcc")
    assert ih.find_nvcc({}, [], which=lambda _: "/opt/cuda-12.8/bin/nvcc") == "/opt/cuda-12.8"
    assert ih.nvcc_wheel("12.8") == "nvidia-cuda-nvcc-cu12==12.8.*"
    assert ih.nvcc_wheel("13.0") == "nvidia-cuda-nvcc==13.0.*"


def test_only_the_architectures_of_the_gpus_present_are_compiled():
    assert ih.cc_list_of(["9.0", "8.0", "9.0"]) == "80,90"
    assert ih.cc_list_of(["[N/A]", ""]) == ""


def test_gpu_build_names_everything_missing_in_one_line():
    message = ih.gpu_missing_message("12.8", [ih.NCCL_MISSING, ih.nvcc_missing("12.8")])
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
    build_env = ih.build_env(None, False)
    assert build_env["CMAKE_POLICY_VERSION_MINIMUM"] == "3.5"
    accepted = subprocess.run([str(cmake), "-S", str(project), "-B", str(tmp_path / "b2")],
                              env=dict(env, CMAKE_POLICY_VERSION_MINIMUM=build_env["CMAKE_POLICY_VERSION_MINIMUM"]),
                              capture_output=True, text=True, timeout=120)
    assert accepted.returncode == 0, accepted.stderr


def test_an_installed_horovod_without_nccl_is_rebuilt_once_nccl_is_there(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ih, "probe_torch", lambda python: ("2.13.0", "13.0"))
    monkeypatch.setattr(ih, "find_nccl", lambda environ: {"HOROVOD_NCCL_INCLUDE": "/i", "HOROVOD_NCCL_LIB": "/l"})
    monkeypatch.setattr(ih, "find_nvcc", lambda environ, sites: "/usr/local/cuda")
    monkeypatch.setattr(ih, "gpu_compute_caps", lambda: ["9.0"])
    monkeypatch.setattr(ih, "installed_matches", lambda python, torch: True)
    checked = []

    def verify(python, expected=ih.EXPECTED_BUILD):
        checked.append(expected)
        raise ih.InstallError("horovodrun --check-build is missing NCCL:")

    def stop(*_args, **_kw):
        raise ih.InstallError("stop before building")

    monkeypatch.setattr(ih, "verify", verify)
    monkeypatch.setattr(ih, "ensure_system_tools", stop)
    with pytest.raises(ih.InstallError, match="stop before building"):
        ih.install(sys.executable, tmp_path, force=False, use_apt=False, test_tools=False)
    assert checked == [("PyTorch", "MPI", "Gloo", "NCCL")]
    assert "is missing NCCL:); rebuilding" in capsys.readouterr().out


def test_an_installed_horovod_built_against_another_torch_is_not_a_match(tmp_path, monkeypatch):
    """After a torch upgrade (2.13 -> 2.15) Horovod still imported, so set-up called it 'already installed';
    only its metadata.json names the torch it was compiled with. A copy of the real package, saying 2.15."""
    import shutil

    import horovod
    import torch

    assert ih.installed_matches(sys.executable, torch.__version__)          # this venv's own build
    copy = tmp_path / "horovod"
    shutil.copytree(Path(horovod.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert ih.installed_matches(sys.executable, torch.__version__)          # the copy imports and matches
    other = "2.15.0+cu132" if torch.__version__ != "2.15.0+cu132" else "2.13.0+cu130"
    (copy / "metadata.json").write_text(f'{{"pytorch": "{other}", "dummy": "none"}}')
    assert not ih.installed_matches(sys.executable, torch.__version__)      # built for another torch: rebuild


@pytest.mark.parametrize("name", ["IDLE_ENV", "EXCHANGE_ENV"])
def test_an_installed_horovod_without_the_perf_patches_is_not_a_match(tmp_path, monkeypatch, name):
    """A wheel built before a part of scripts/horovod_perf.py landed imports and has the bf16 binding, yet ignores
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
    variable = getattr(ih, name).encode()
    assert variable in data and ih.installed_matches(sys.executable, torch.__version__)
    lib.write_bytes(data.replace(variable, b"HOROVOD_XX" + b"X" * (len(variable) - 10)))   # same length: still loads
    assert not ih.installed_matches(sys.executable, torch.__version__)


def test_the_torch_extension_gets_the_standard_torchs_header_demands(horovod_source, tmp_path):
    """torch 2.15's headers stop at `#error C++20 or later`: the patched CMake takes the standard found there."""
    ih.apply_cxx17_fix(horovod_source)
    text = (horovod_source / "horovod/torch/CMakeLists.txt").read_text()
    start = text.index(ih.CXX17_MARKER)
    block = text[start:text.index("endif()", start) + len("endif()")]
    (tmp_path / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.13)\nproject(p NONE)\n"
                                             'set(Pytorch_VERSION "2.15.0")\n' + block +
                                             '\nmessage(STATUS "STD=${CMAKE_CXX_STANDARD}")\n')
    for given, expected in (("20", "20"), (None, "17")):
        env = {k: v for k, v in os.environ.items() if k != "HVDTRAIN_TORCH_CXX_STANDARD"}
        if given:
            env["HVDTRAIN_TORCH_CXX_STANDARD"] = given
        proc = subprocess.run(["cmake", "-S", str(tmp_path), "-B", str(tmp_path / f"b{given}")], env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert f"STD={expected}" in proc.stdout
    assert ih.torch_cxx_standard(sys.executable) >= 17
