"""Build horovod 0.28.1 + hvdtrain's C++17/gcc13 fixes + scripts/horovod_perf.py into /tmp/Evenv."""
import pathlib
import sys

sys.path.insert(0, "/work/main/scripts")
import install_horovod as ih
from horovod_perf import PERF_MARKER, PERF_PATCHES

src = pathlib.Path("/tmp/E/src")
ih.apply_gcc13_fix(src)
ih.apply_cxx17_fix(src)
ih.apply_cxx17_fix(src, PERF_PATCHES, PERF_MARKER)
py = "/tmp/Evenv/bin/python"
env = ih.build_env(None, False, {"HVDTRAIN_TORCH_CXX_STANDARD": str(ih.torch_cxx_standard(py))})
wheel = ih.compile_wheel(py, src, pathlib.Path("/tmp/E/dist"), env, pathlib.Path("/tmp/E/build.log"))
ih.install_wheel(py, wheel, pathlib.Path("/tmp/E/install.log"))
print(ih.verify(py))
