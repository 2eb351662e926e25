"""Keep freed memory in the process, so that a CPU training step does not fault its activations in afresh.

glibc's malloc serves allocations above a threshold (at most 32 MiB) with fresh `mmap`s and returns freed memory
at the top of the heap to the kernel. A Neural Interpreter's training step allocates and frees about a gigabyte
of such tensors (the (U, B, N, d) streams of every function iteration, the attention's columns), and the kernel
can then map and zero those pages again at every step. In a bare training loop of the digits preset at batch 128
on CPU that was 272,150 page faults and 14% of the step's CPU time, against none for the paper's ViT baseline;
how much of it a process sees depends on what it allocated before (benchmarks/RESULTS.md).

`keep_freed_memory()` tells glibc to serve every allocation from the heap and never to shrink it, as
`MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=-1` would at start-up. It acts on the whole process, and the process
then holds on to its peak memory until it exits (as PyTorch's CUDA caching allocator does on a GPU). This module is
not imported by the model code; the example scripts call it with `--keep_freed_memory true`, the benchmark with
`--keep-freed-memory`.
"""

from __future__ import annotations

import ctypes
import logging
import sys

logger = logging.getLogger(__name__)

# mallopt parameters, glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4

# Help text of the example scripts' --keep_freed_memory option.
KEEP_FREED_MEMORY_HELP = (
    "On a CPU with glibc: keep freed memory in the process for reuse (ni_hf.cpu_allocator) instead of returning it "
    "to the OS and faulting it in again at every step. It removed the page faults of a bare digits-preset training "
    "loop (12-15%% less CPU time per step), but no wall-time gain could be measured in run_digits.py on a shared "
    "2-core machine (benchmarks/RESULTS.md). The process then holds its peak memory. No effect on GPU runs."
)


def _glibc() -> ctypes.CDLL | None:
    """The process's C library if it is glibc (which has `mallopt` and `gnu_get_libc_version`), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it (musl has a mallopt that does nothing)
        libc.mallopt  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def keep_freed_memory() -> bool:
    """Serve every allocation from the heap and never return freed memory to the OS (glibc only).

    Returns whether it took effect: False on other C libraries and operating systems, where it does nothing.
    """
    libc = _glibc()
    if libc is None:
        logger.info("keep_freed_memory: not glibc on Linux; the allocator is left as it is")
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    # -1 converts to SIZE_MAX inside glibc: no trimming at all (mallopt(3)).
    applied = bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, -1))
    if applied:
        logger.info("keep_freed_memory: glibc now keeps freed memory for reuse (no mmap, no trimming)")
    else:
        logger.warning("keep_freed_memory: glibc's mallopt refused the settings; the allocator is unchanged")
    return applied
