"""hvdtrain's patches to Horovod 0.28.1 (scripts/horovod/patches, in the order of `series`): each a real unified
diff with a header, applied to the pristine sdist with `patch -p1 --forward --fuzz=0`, and what each one builds,
checked on the patched sources (compiled with g++ or configured with CMake where that is what matters)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import install_build as build
import install_plan as plan
import install_toolchain as toolchain
import pytest

INSTALLER_SDIST_CACHE = Path(os.environ.get("HVDTRAIN_CACHE", Path.home() / ".cache" / "hvdtrain")) / "sdist"


@pytest.fixture(scope="module")
def horovod_sdist(tmp_path_factory):
    """The pristine horovod 0.28.1 sdist, unpacked once and never patched itself: the copy the installer keeps in
    its cache when there (no network), else downloaded with pip. Either way checked against SDIST_SHA256."""
    dest = tmp_path_factory.mktemp("sdist")
    cache = INSTALLER_SDIST_CACHE if (INSTALLER_SDIST_CACHE / build.SDIST).is_file() else None
    return build.download_sdist(sys.executable, dest, dest / "download.log", cache)


@pytest.fixture
def horovod_source(horovod_sdist, tmp_path):
    """A fresh copy of the unpacked sdist for each test: a patch one test applies is not there for the next, in
    any order (33 MB, about a second)."""
    return Path(shutil.copytree(horovod_sdist, tmp_path / "horovod-src", symlinks=True))


@pytest.fixture
def patched_source(horovod_source):
    build.apply_series(horovod_source)
    return horovod_source


def test_the_series_applies_to_the_pristine_sdist_exactly_and_once(horovod_source):
    """No fuzz, no offset left behind (.orig/.rej), and a tree already patched is refused, naming the patch."""
    names = [path.name for path in plan.series()]
    assert build.apply_series(horovod_source) == names
    assert not [p for p in horovod_source.rglob("*") if p.suffix in (".orig", ".rej")]
    with pytest.raises(plan.InstallError, match=f"^{re.escape(names[0])} does not apply to horovod 0.28.1"):
        build.apply_series(horovod_source)
    # What hvdtrain and the installer's check look for is in the sources (0007, 0008, 0009)
    bindings = (horovod_source / "horovod/torch/mpi_ops_v2.cc").read_text()
    # 8 operations, each for CPU tensors and for CUDA ones (on the GPU or staged through host memory)
    assert bindings.count('_BFloat16Tensor", &Do') == 8 * 3 and f'"{plan.BF16_BINDING}"' in bindings
    assert "HOROVOD_BFLOAT16 = 10," in (horovod_source / "horovod/common/message.h").read_text()
    queue = (horovod_source / "horovod/common/tensor_queue.cc").read_text()
    assert queue.count("enqueued_.notify_one();") == 2   # both ways in: one tensor, a grouped list
    operations = (horovod_source / "horovod/common/operations.cc").read_text()
    assert f'"{plan.IDLE_ENV}"' in operations and "WaitWhileIdle(" in operations
    gloo = (horovod_source / "horovod/common/ops/gloo_operations.cc").read_text()
    assert f'"{plan.EXCHANGE_ENV}"' in gloo and "AdjacentInPlace(entries)" in gloo
    assert "GlooAlgorithms<BFloat16>" in gloo
    torch_cmake = (horovod_source / "horovod/torch/CMakeLists.txt").read_text()
    assert "list(APPEND PYTORCH_LINKER_LIBS compatible17_gloo)" in torch_cmake
    top = (horovod_source / "CMakeLists.txt").read_text()
    assert "Pytorch_CXX17 AND Pytorch_CXX17" in top
    # the C++11 gloo only where a target links it (none with torch >= 2.1 alone): a third of the compile
    assert "add_subdirectory(third_party/gloo EXCLUDE_FROM_ALL)" in top


def test_every_patch_explains_itself_and_only_its_diff_is_in_the_cache_key(tmp_path):
    """Headers say why, upstream's reference, what depends on it and what switches it on; a changed diff, a new
    patch or another order gives another wheel (a reworded header does not)."""
    names = [path.name for path in plan.series()]
    assert names and all(name[:4].isdigit() and name.endswith(".patch") for name in names) and names == sorted(names)
    assert sorted(p.name for p in plan.PATCH_DIR.glob("*.patch")) == names        # none left out of the series
    for number, path in enumerate(plan.series(), start=1):
        head = path.read_text().split("\n---\n", 1)[0]
        assert f"Subject: [PATCH {number}/{len(names)}]" in head, path.name
        for part in ("Why:", "Upstream:", "Depends on it:", "Switched on by:"):
            assert part in head, (path.name, part)
    copy = tmp_path / "patches"
    shutil.copytree(plan.PATCH_DIR, copy)
    assert plan.series_hash(copy) == plan.series_hash() == plan.PATCH_SET_HASH
    first = copy / names[0]
    first.write_text(first.read_text().replace("Why:", "Why (reworded):", 1))
    assert plan.series_hash(copy) == plan.series_hash()            # a header only explains
    first.write_text(first.read_text() + "+\n")
    assert plan.series_hash(copy) != plan.series_hash()            # the diff is what is built
    base = dict(horovod="0.28.1", torch="2.13.0+cpu", python="3.11", cuda=None, nccl=False)
    assert plan.cache_key(**base, patches=plan.series_hash(copy)) != plan.cache_key(**base)
    shutil.copy2(plan.PATCH_DIR / names[0], first)
    (copy / "series").write_text("\n".join(reversed(names)) + "\n")
    assert plan.series_hash(copy) != plan.series_hash()


def test_a_tree_the_patches_do_not_fit_stops_with_one_line_naming_the_patch(tmp_path):
    names = [path.name for path in plan.series()]
    tree = tmp_path / "src"
    (tree / "horovod/runner/elastic").mkdir(parents=True)
    (tree / "horovod/runner/elastic/worker.py").write_text("not horovod 0.28.1\n")
    with pytest.raises(plan.InstallError, match=names[0]) as raised:
        build.apply_series(tree)
    assert "\n" not in str(raised.value)


def test_a_sdist_with_other_bytes_is_refused_before_anything_is_patched(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / build.SDIST).write_bytes(b"not the sdist")
    with pytest.raises(plan.InstallError, match="not the horovod 0.28.1 sdist the patch series is written for"):
        build.download_sdist(sys.executable, tmp_path / "dest", tmp_path / "log", cache)


@pytest.mark.skipif(not shutil.which("g++"), reason="needs g++ to compile the patched header")
def test_patched_half_header_rounds_bf16_as_torch_does(patched_source, tmp_path):
    """0007's bf16 helpers compiled for real (strict C++17) and run on float32 bit patterns, against torch."""
    import torch

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
    built = subprocess.run(["g++", "-std=c++17", "-pedantic-errors", "-O1", f"-I{patched_source / 'horovod/common'}",
                            str(unit), "-o", str(tmp_path / "unit")], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    ran = subprocess.run([str(tmp_path / "unit")], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran
    got = torch.frombuffer(bytearray((tmp_path / "out.bin").read_bytes()), dtype=torch.int16)
    want = values.to(torch.bfloat16).view(torch.int16)
    nan = torch.isnan(values)
    assert torch.equal(got[~nan], want[~nan])
    assert torch.isnan(got[nan].view(torch.bfloat16)).all()      # a NaN stays a NaN (its payload may differ)


# Standard names 0.28.1's patched headers use, and the header g++ 13's libstdc++ needs included for each.
STD_NAMES = {r"\bu?int(8|16|32|64)_t\b": "<cstdint>", r"\bstd::string\b": "<string>",
             r"\bstd::(logic_error|runtime_error|invalid_argument)\b": "<stdexcept>"}
GCC13_HEADERS = ("horovod/common/common.h", "horovod/common/group_table.h")   # what 0004 edits


def undeclared(text: str) -> set[str]:
    """The standard headers a file uses names from without including them itself."""
    return {header for pattern, header in STD_NAMES.items()
            if re.search(pattern, text) and f"#include {header}" not in text}


def test_gcc13_patch_adds_the_includes_the_headers_rely_on(horovod_source):
    """0004, horovod#3957: g++ 13 no longer brings these in through <mutex>/<vector>/<string>."""
    files = {rel: (horovod_source / rel).read_text() for rel in GCC13_HEADERS}
    assert undeclared(files["horovod/common/group_table.h"]) == {"<cstdint>", "<string>"}
    assert "<stdexcept>" in undeclared(files["horovod/common/common.h"])
    build.apply_series(horovod_source)
    for rel in GCC13_HEADERS:
        assert undeclared((horovod_source / rel).read_text()) == set(), rel


@pytest.mark.skipif(not shutil.which("g++"), reason="needs g++ to compile the patched headers")
@pytest.mark.parametrize("header", GCC13_HEADERS)
def test_patched_headers_compile_alone_as_strict_cxx17(patched_source, header, tmp_path):
    """Each patched header first and alone in a TU, ISO C++17 with pedantic errors (the strictest check
    here: this machine's g++ is 12, whose libstdc++ still includes more transitively than 13's, so the
    include check above is what proves the g++ 13 fix; this proves the patched headers are valid C++17)."""
    unit = tmp_path / "unit.cc"
    unit.write_text(f'#include "{Path(header).name}"\nint main() {{ return 0; }}\n')
    proc = subprocess.run(["g++", "-std=c++17", "-pedantic-errors", "-fsyntax-only",
                           f"-I{patched_source / Path(header).parent}", str(unit)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def cmake_block(text: str, start: str) -> str:
    """From the line `start` to the first endif() after it: one block of a patched CMake file, to run alone."""
    begin = text.index(start)
    return text[begin:text.index("endif()", begin) + len("endif()")]


def configure(project: Path, body: str, env: dict[str, str]) -> str:
    project.mkdir(parents=True, exist_ok=True)
    (project / "CMakeLists.txt").write_text(f"cmake_minimum_required(VERSION 3.13)\nproject(p NONE)\n{body}\n")
    proc = subprocess.run(["cmake", "-S", str(project), "-B", str(project / "b")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_the_cpu_only_switch_makes_horovods_find_pytorch_call_torch_a_cpu_build(patched_source, tmp_path):
    """0006's FindPytorch.cmake: a CUDA torch with a CUDA toolkit present is a CPU build under the switch
    (CppExtension: no cudart to link, no add_cuda()), and still a CUDA build without it."""
    text = (patched_source / "cmake/Modules/FindPytorch.cmake").read_text()
    block = cmake_block(text, 'string(TOUPPER "${Pytorch_CUDA}" Pytorch_CUDA)')
    for switch, cuda in (("1", "FALSE"), ("", "TRUE")):
        env = dict(os.environ, HVDTRAIN_HOROVOD_CPU_ONLY=switch)
        out = configure(tmp_path / f"p{switch}", f'set(Pytorch_CUDA True)\n{block}\n'
                        'message(STATUS "Pytorch_CUDA=${Pytorch_CUDA}")', env)
        assert f"Pytorch_CUDA={cuda}" in out


def test_the_torch_extension_gets_the_standard_torchs_header_demands(patched_source, tmp_path):
    """0005: torch 2.15's headers stop at `#error C++20 or later`: the patched CMake takes the standard found
    there (HVDTRAIN_TORCH_CXX_STANDARD, which the build sets from torch's header), else C++17; torch 2.0 keeps 14."""
    text = (patched_source / "horovod/torch/CMakeLists.txt").read_text()
    block = cmake_block(text, "# hvdtrain: C++17 fix for torch >= 2.1")
    for version, given, expected in (("2.15.0", "20", "20"), ("2.15.0", None, "17"), ("2.0.1", "20", "14")):
        env = {k: v for k, v in os.environ.items() if k != "HVDTRAIN_TORCH_CXX_STANDARD"}
        if given:
            env["HVDTRAIN_TORCH_CXX_STANDARD"] = given
        out = configure(tmp_path / f"p{version}{given}", f'set(Pytorch_VERSION "{version}")\n{block}\n'
                        'message(STATUS "STD=${CMAKE_CXX_STANDARD}")', env)
        assert f"STD={expected}" in out
    assert toolchain.torch_cxx_standard(sys.executable) >= 17


def _wheel_layout(site: Path) -> Path:
    """The layout of torch's nvidia-nccl wheel: the header and only the versioned library."""
    root = site / "nvidia" / "nccl"
    (root / "include").mkdir(parents=True)
    (root / "lib").mkdir()
    (root / "include" / "nccl.h").write_text("#define NCCL_MAJOR 2\n#define NCCL_VERSION_CODE 22907\n")
    (root / "lib" / "libnccl.so.2").write_bytes(b"")
    return root


def test_nccl_from_torchs_wheel_is_found_by_horovods_own_find_module(patched_source, tmp_path):
    """The toolchain's answer for torch's NCCL wheel, handed to the FindNCCL.cmake of the tree that is built."""
    root = _wheel_layout(tmp_path / "site")
    found = toolchain.find_nccl_wheel([str(tmp_path / "empty"), str(tmp_path / "site")])
    assert found == {"HOROVOD_NCCL_INCLUDE": f"{root}/include", "HOROVOD_NCCL_LIB": f"{root}/lib",
                     "HOROVOD_NCCL_LINK": "SHARED"}
    env = toolchain.nccl_link_dir(found, tmp_path / "link")
    assert (tmp_path / "link" / "libnccl.so").resolve() == root / "lib" / "libnccl.so.2"
    out = configure(tmp_path / "proj", f"list(APPEND CMAKE_MODULE_PATH {patched_source}/cmake/Modules)\n"
                    "find_package(NCCL REQUIRED)\n"
                    'message(STATUS "NCCL_LIBS=${NCCL_LIBRARIES} MAJOR=${NCCL_MAJOR_VERSION}")',
                    dict(os.environ, **env))
    assert f"NCCL_LIBS={tmp_path / 'link' / 'libnccl.so'} MAJOR=2" in out
    assert toolchain.find_nccl_wheel([str(tmp_path / "empty")]) is None
