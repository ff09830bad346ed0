"""Host allocator settings for a compute process (the scheduler, a TP rank, the offline
Engine) on Linux with glibc, and the release of its free heap when idle.

glibc serves every allocation above its mmap threshold (128 KiB, raised dynamically up to
32 MiB as large blocks are freed) with a fresh mmap, and returns freed memory past the
trim threshold to the kernel: a CPU forward, which allocates and frees activations of a
few MiB per op, then pays a page fault for every 4 KiB it touches, on every step. Fixing
the thresholds (mmap above 32 MiB only; keep up to 256 MiB of freed heap) made a
1024-token prefill step of the default model ~20% faster on 2 cores
(docs/benchmarks.md, "CPU fast path"). jemalloc or tcmalloc (LD_PRELOAD) do the same
and more; this needs nothing installed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

logger = logging.getLogger(__name__)

# mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest dynamic threshold on 64-bit
TRIM_THRESHOLD = 256 << 20


def tune_host_malloc() -> bool:
    """Set the thresholds (idempotent); False where there is no glibc mallopt."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    logger.debug("host malloc thresholds set: %s", ok)
    return ok


def release_free_heap() -> bool:
    """Return the free memory glibc keeps (up to TRIM_THRESHOLD at each heap's top, and
    free pages inside the heaps, which the allocator's fragmentation leaves) to the
    kernel: `malloc_trim(0)`. The scheduler calls it once it has been idle for a while
    after running batches, so that a server at rest holds only what it uses; the next
    forward then pays its page faults again, once. True if memory was released."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    return bool(trim(0))
