"""keep_host_memory: a step's freed tensors stay in the process instead of being faulted back in."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hvdtrain.train.host_memory import glibc_malloc_in_use

# A step in miniature, straight through glibc (torch's CPU allocator calls the same malloc): 40 one-MiB
# blocks allocated, written and freed, five times; the page faults of the last three rounds. With glibc's
# own thresholds the freed top of the heap exceeds twice the largest block, so it goes back to the
# kernel each round and is faulted in again. (Through torch.empty the count varied between runs:
# torch's own small allocations sometimes sat at the top of the heap and stopped the trim.)
STEPS = """
import ctypes, json, resource, sys
from hvdtrain.train.host_memory import keep_host_memory
applied = keep_host_memory(sys.argv[1] == "keep")
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
faults = []
for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [libc.malloc(1 << 20) for _ in range(40)]
    for block in blocks:
        ctypes.memset(block, 1, 1 << 20)
    for block in blocks:
        libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "faults": sum(faults[2:])}))
"""


def steps(mode: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True, text=True, timeout=120,
                          env={**clean, **env}, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not glibc_malloc_in_use(), reason="glibc malloc only")
def test_kept_memory_is_not_faulted_in_again_each_step():
    glibc = steps("off")
    kept = steps("keep")
    assert not glibc["applied"] and kept["applied"]
    assert glibc["faults"] > 3 * 40 * 256 * 0.9, glibc       # each round faulted its 40 MiB back in
    assert kept["faults"] < glibc["faults"] / 10, (kept, glibc)


@pytest.mark.skipif(not glibc_malloc_in_use(), reason="glibc malloc only")
def test_the_users_malloc_settings_are_left_alone():
    assert not steps("keep", MALLOC_TRIM_THRESHOLD_="131072")["applied"]
