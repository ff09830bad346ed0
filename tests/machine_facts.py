"""This machine's CPU facts read straight from /proc/cpuinfo and the affinity mask, for
tests that check what radixlm derived from them (not recomputed with radixlm's code)."""

from __future__ import annotations

import os

BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def _cpuinfo_blocks() -> list[dict[str, str]]:
    with open("/proc/cpuinfo") as f:
        blocks = f.read().strip().split("\n\n")
    return [dict((k.strip(), v.strip()) for k, _, v in (line.partition(":")
                                                        for line in b.splitlines()))
            for b in blocks]


def cpu_flags() -> set[str]:
    blocks = _cpuinfo_blocks()
    return set(blocks[0].get("flags", "").split()) if blocks else set()


def physical_cores() -> int:
    """Distinct (socket, core) pairs, at most the CPUs this process may run on."""
    blocks = _cpuinfo_blocks()
    cores = {(b.get("physical id"), b.get("core id")) for b in blocks if "processor" in b}
    n = len(cores) if all(c != (None, None) for c in cores) else len(blocks)
    return min(n, len(os.sched_getaffinity(0)))
