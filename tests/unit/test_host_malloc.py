"""host_malloc: memory freed by Python, which the tuned glibc keeps, goes back to the
kernel (RSS falls); a compute process's large tensors land on huge pages unless the user
set THP_MEM_ALLOC_ENABLE=0."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from radixlm.runtime.host_malloc import THP_ENV, thp_mode

_CHILD = """
import gc
from radixlm.runtime.host_malloc import release_free_heap, tune_host_malloc
assert tune_host_malloc()  # keep up to 256 MiB of free heap, as a compute process does
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
blocks = [bytearray(64 << 10) for _ in range(3000)]  # ~190 MiB below the mmap threshold
for b in blocks:
    b[::4096] = b"x" * len(b[::4096])  # touch every page
peak = rss()
del blocks, b
gc.collect()
kept = rss()
assert release_free_heap()
after = rss()
print(peak >> 20, kept >> 20, after >> 20)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_release_free_heap_returns_kept_memory():
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    peak, kept, after = map(int, out)
    assert kept > peak - 60  # freed, but the allocator kept most of it (the threshold)
    assert after < kept - 120  # released: RSS fell by most of the 190 MiB


_COMPUTE_CHILD = """
from radixlm.config import ServerArgs
from radixlm.runtime.host_malloc import huge_pages_active
from radixlm.runtime.process_threads import setup_compute_process
setup_compute_process(ServerArgs(num_threads=1))  # as the scheduler does
print(huge_pages_active())
"""


def _compute_child(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != THP_ENV}
    if env_value is not None:
        env[THP_ENV] = env_value
    return subprocess.run([sys.executable, "-c", _COMPUTE_CHILD], capture_output=True,
                          text=True, timeout=120, check=True, env=env).stdout.split()[-1]


@pytest.mark.skipif(thp_mode() not in ("madvise",), reason="THP off, or on for every mapping")
def test_compute_process_weights_land_on_huge_pages_unless_opted_out():
    assert _compute_child(None) == "True"  # the scheduler's setup asks for them
    assert _compute_child("0") == "False"  # the user's 0 is kept
