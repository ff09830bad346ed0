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

Huge pages: a decode step streams every weight once; with 4 KiB pages a 200 MB LM head
walks ~50k pages and the TLB misses cap the read well below the memory's bandwidth
(Gemma 3's int8 head: 1.4-1.8x faster on 2 MiB pages, docs/benchmarks.md). c10's CPU
allocator aligns allocations of >= 2 MiB to 2 MiB and advises MADV_HUGEPAGE when
THP_MEM_ALLOC_ENABLE=1 is set before the process's first allocation (it reads it once).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

# mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest dynamic threshold on 64-bit
TRIM_THRESHOLD = 256 << 20
THP_ENV = "THP_MEM_ALLOC_ENABLE"
HUGE_PAGE = 2 << 20
THP_MODE_FILE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


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


def request_huge_pages() -> None:
    """Ask torch's CPU allocator for huge pages (THP_ENV=1), unless the user set the
    variable (0 opts out). Effective only before the process's first torch allocation
    (and inherited by the processes it spawns after)."""
    os.environ.setdefault(THP_ENV, "1")


def thp_mode() -> str:
    """The kernel's transparent huge page mode: always, madvise, never ('' if unknown)."""
    try:
        text = THP_MODE_FILE.read_text()
    except OSError:
        return ""
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else ""


def huge_pages_active() -> bool:
    """Do this process's large torch allocations land on huge pages? A touched 8 MiB
    probe: its mapping's AnonHugePages in /proc/self/smaps (False where unreadable)."""
    if thp_mode() in ("", "never"):
        return False
    import torch

    probe = torch.ones(4 * HUGE_PAGE, dtype=torch.uint8)
    return _anon_huge_kib(probe.data_ptr()) > 0


def _anon_huge_kib(addr: int) -> int:
    """AnonHugePages (KiB) of the mapping holding `addr`, from /proc/self/smaps."""
    inside = False
    try:
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                head = line.split(" ", 1)[0]
                if "-" in head and not head.endswith(":"):  # a mapping's first line
                    lo, hi = (int(v, 16) for v in head.split("-"))
                    inside = lo <= addr < hi
                elif inside and line.startswith("AnonHugePages:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0
