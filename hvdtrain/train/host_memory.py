"""Keep freed host memory in the process, so a training step does not page-fault its tensors back in.

glibc's malloc adapts two thresholds as a program runs: blocks above the mmap threshold get pages
of their own, and free memory above the trim threshold at the top of the heap goes back to the
kernel. Where they settle depends on the order of earlier allocations. A step allocates and frees
the same megabyte-sized tensors (activations, gradients) every time; when the thresholds settle low,
each step returns those pages and then faults them in again, zero-filled, inside the step's kernels.
On the MLP benchmark the trainer took ~300 more page faults a step than the hand-written loop, and
with fixed thresholds its cost over that loop fell from ~250 to ~60-150 us a step
(benchmarks/results/2026-12-03-i-step-overhead).

The price: the process keeps its peak heap instead of shrinking between steps, which a training
process wants anyway (torch's CUDA allocator keeps its cache for the same reason). Off with
`keep_host_memory: false`. MALLOC_TRIM_THRESHOLD_/MALLOC_MMAP_THRESHOLD_ in the environment, or a
preloaded allocator (jemalloc, tcmalloc, mimalloc), are left alone.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

# glibc caps the mmap threshold at 32 MiB on 64-bit; a larger block still gets pages of its own.
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 1 << 30

_applied = False


def glibc_malloc_in_use() -> bool:
    """True when this process allocates with glibc's malloc (not musl, macOS, or a preloaded allocator)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    return not any(name in os.environ.get("LD_PRELOAD", "") for name in ("jemalloc", "tcmalloc", "mimalloc"))


def keep_host_memory(enabled: bool = True) -> bool:
    """Fix glibc's trim and mmap thresholds for this process (once). Returns whether they are fixed."""
    global _applied
    if _applied or not enabled or not glibc_malloc_in_use():
        return _applied
    if "MALLOC_TRIM_THRESHOLD_" in os.environ or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False    # the user's own choice
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    # Setting a threshold also stops glibc from moving it; mallopt returns 1 on success.
    results = [libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD), libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)]
    _applied = all(result == 1 for result in results)
    return _applied
