"""The C allocator's settings for inference on a CPU (docs/runtime.md, "Allocator").

glibc's malloc serves large blocks (from 128 KiB, a threshold it raises by itself up to 32 MiB) with fresh
memory mappings and gives freed memory at the top of its heap back to the system. An encoder window
allocates and frees tens of megabyte-sized activations, and every decoding step a few vocabulary-sized
ones, so the process keeps asking the kernel for pages it has just returned, and unmapping memory that
several threads have touched interrupts all of them. Keeping freed memory for reuse is what PyTorch's CPU
tuning guide gets from jemalloc or tcmalloc; here it is two `mallopt` calls, no preloaded library.

The price: up to `TRIM_THRESHOLD` bytes freed at the top of the heap stay with the process, so its
resident size tracks its peak use instead of falling back between windows. Blocks over
`MMAP_THRESHOLD` are still mapped and unmapped as before."""

from __future__ import annotations

import ctypes
import functools
import gc
import sys

M_TRIM_THRESHOLD = -1    # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20   # the largest glibc accepts on 64-bit systems
TRIM_THRESHOLD = 256 * 2**20


@functools.cache
def keep_freed_memory() -> bool:
    """Set glibc's malloc to keep freed memory for reuse, once per process. False where the C library is
    not glibc (macOS, Windows, musl): nothing is changed there."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it; musl's mallopt does nothing
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def release_freed_memory() -> bool:
    """Give the memory malloc holds freed back to the system (glibc's `malloc_trim`, which also returns the
    free pages inside its heaps, not only at their tops), after a full garbage collection: tensors that
    only reference cycles still hold are freed by Python's oldest generation, which runs rarely, and until
    then no trim can return them (a probe decoding batches of 1-8 rows in turn rose by 60-90 MB every 30
    decodes without it and stayed level with it: docs/serving.md). A batch of N 30 s windows leaves its working set
    behind as freed memory (tiny.en, 2 threads: about 380 MB after a batch of 8); a long-running server
    calls this when it has been idle a while, so its resident size falls back instead of staying at its
    largest batch (docs/serving.md, "Load and faults"). False where the C library is not glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    gc.collect()
    trim(0)
    return True
