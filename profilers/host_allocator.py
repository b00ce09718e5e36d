"""Host memory allocator settings for a CPU timing child: steps timed as a training run's.

A training process runs one config: every step allocates and frees the same tensors, and glibc
malloc's dynamic thresholds settle on them. A timing child interleaves two micro-batch sizes
(:func:`profilers.phases_time._timing_child`), and the alternation keeps glibc returning the
larger size's memory to the kernel and faulting it back in: the larger size read 5-10% slower
than the same size run alone (gpt-tiny fp32 mb 8, one thread, fresh processes alternating; 0.251
s interleaved with mb 2 against 0.237 s alone, and 0.236 s interleaved once the thresholds were
pinned: ``benchmarks/timing_child_ab.py``, ``benchmarks/results/timing_child_ab*`` and
``benchmarks/results/timing_child_variants/``).
The profiler-accuracy benchmark saw it as a "drift": the profile's timings 5-32% above the
truth's, always in that direction.

:func:`steady_malloc` pins the two thresholds (``mallopt``, as the ``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_`` environment variables would at start-up): blocks up to 32 MiB come
from the heap, and the heap is not trimmed below 1 GiB of free top. glibc on Linux only; a
no-op elsewhere (macOS, musl), where the effect was not measured. It changes host memory only:
CUDA tensors come from PyTorch's caching allocator.
"""

from __future__ import annotations

import ctypes
import sys

# glibc's malloc.h parameter numbers.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc's own ceiling for its dynamic mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX:
# 4 MiB * sizeof(long)); older glibc refuses a larger one.
MMAP_THRESHOLD_BYTES = 32 * 2**20
TRIM_THRESHOLD_BYTES = 2**30  # mallopt takes an int


def steady_malloc() -> bool:
    """Pin glibc malloc's mmap and trim thresholds in this process; True when both were set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: musl's mallopt does nothing
    except (OSError, AttributeError):
        return False
    if hasattr(mallopt, "argtypes"):  # a ctypes function: declare its C signature
        mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        mallopt.restype = ctypes.c_int
    return bool(
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
