"""Host allocator settings for a compute process (the scheduler, a TP rank, the offline
Engine) on Linux with glibc: malloc thresholds, huge pages, releasing free heap when idle.

glibc's dynamic mmap threshold made a CPU forward page-fault every 4 KiB of its
activations on every step; fixed thresholds (mmap above 32 MiB; keep 256 MiB of freed
heap) made a 1024-token prefill ~20% faster (docs/benchmarks.md, "CPU fast path").
Huge pages: a decode step streams every weight once, and on 4 KiB pages the TLB misses
cap the read (Gemma 3's 200 MB int8 head: 1.4-1.8x faster on 2 MiB pages). The loaded
weights are collapsed in place (MADV_COLLAPSE); the KV pool maps fresh zero pages, huge
when written. Not every allocation (c10's THP_MEM_ALLOC_ENABLE): then each fresh
activation buffer paid a huge-page fault (a 6 MB cast 0.2 -> 8-21 ms). See docs/tuning.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads after the compute process has set its thread count
    import torch

logger = logging.getLogger(__name__)

# mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest dynamic threshold on 64-bit
TRIM_THRESHOLD = 256 << 20
HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25  # Linux >= 6.1
# Storages at most this far apart are collapsed as one run: most projections are under
# 2 MiB, so only runs over several of them hold aligned 2 MiB blocks (the default model:
# 40 of its 179 MB with a 64 KiB gap, 166 with 2 MiB). What lies between is the heap's.
SPAN_GAP = HUGE_PAGE
THP_MODE_FILE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def tune_host_malloc() -> bool:
    """Set the thresholds (idempotent); False where there is no glibc mallopt."""
    if not sys.platform.startswith("linux"):
        return False
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:  # musl and others: no mallopt
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
    trim = getattr(_libc(), "malloc_trim", None)
    return bool(trim(0)) if trim is not None else False


def collapse_to_huge_pages(tensors: Iterable["torch.Tensor"]) -> int:
    """Back the tensors' memory with huge pages now: MADV_COLLAPSE over every 2 MiB-aligned
    run inside their storages (merged where adjacent). The kernel copies the pages in
    place; addresses and contents stay. Returns the bytes collapsed (0 where the kernel,
    its THP mode or the platform cannot)."""
    if not sys.platform.startswith("linux") or thp_mode() in ("", "never"):
        return 0
    spans = sorted({(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
                    for t in tensors if _plain_cpu(t)})
    merged: list[list[int]] = []
    for start, size in spans:
        if merged and start <= merged[-1][1] + SPAN_GAP:
            merged[-1][1] = max(merged[-1][1], start + size)
        else:
            merged.append([start, start + size])
    libc = _libc()
    if libc is None:
        return 0
    done, errors = 0, set()
    for start, end in merged:
        lo, hi = -(-start // HUGE_PAGE) * HUGE_PAGE, end // HUGE_PAGE * HUGE_PAGE
        if hi <= lo:
            continue
        if libc.madvise(lo, hi - lo, MADV_COLLAPSE) == 0:
            done += hi - lo
        else:  # an old kernel (EINVAL), a file mapping, no free huge page (EAGAIN/ENOMEM)
            errors.add(ctypes.get_errno())
    if errors:
        logger.info("huge pages: MADV_COLLAPSE refused some weights (errno %s)", sorted(errors))
    return done


def zeros_on_huge_pages(shape: tuple[int, ...], dtype: "torch.dtype") -> "torch.Tensor":
    """A zero CPU tensor on its own private anonymous mapping, advised MADV_HUGEPAGE: the
    kernel's zero pages, faulted in (as huge pages) on first write, so creating it costs
    no pass over the memory (a 1.4 GB KV pool zeroed with torch.zeros took seconds of
    every start). Unmapped when the tensor and its views are gone."""
    import mmap

    import torch

    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = itemsize
    for n in shape:
        nbytes *= n
    if nbytes == 0 or not sys.platform.startswith("linux"):
        return torch.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = torch.frombuffer(buf, dtype=torch.uint8)  # keeps `buf` mapped while it lives
    start = raw.data_ptr()
    offset = -start % HUGE_PAGE
    if thp_mode() in ("madvise", "always"):
        libc = _libc()
        if libc is not None:
            libc.madvise(start + offset, nbytes // HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE)
    return raw[offset:offset + nbytes].view(dtype).view(shape)


@functools.cache
def _libc() -> "ctypes.CDLL | None":
    """The C library (errno kept for madvise), loaded once; None where it cannot be."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    except (OSError, AttributeError):
        return None
    return libc


def _plain_cpu(t: "torch.Tensor") -> bool:
    """A strided CPU tensor with real storage (oneDNN's packed weights are opaque)."""
    import torch

    return t.device.type == "cpu" and t.layout == torch.strided and t.numel() > 0


def thp_mode() -> str:
    """The kernel's transparent huge page mode: always, madvise, never ('' if unknown)."""
    try:
        text = THP_MODE_FILE.read_text()
    except OSError:
        return ""
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else ""


def anon_huge_kib(addr: int) -> int:
    """AnonHugePages (KiB) of the mapping holding `addr`, from /proc/self/smaps (tests)."""
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
