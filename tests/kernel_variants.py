"""The C++ kernels built with narrower instruction sets (the AVX2 and plain-loop paths
that other machines compile), for the kernels' unit tests.

The first `variant()` call builds every variant at once, one g++ process each (they share
the cores instead of queueing: ~40 s each on one core), into the kernel cache directory
keyed by the sources and flags; each test then loads its own (ninja finds it built).
"""

from __future__ import annotations

import functools
import hashlib
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "radixlm" / "cpu_kernels"
# (kernel, path) -> extra compiler flags; `path` is what the built module reports.
VARIANTS: dict[tuple[str, int], list[str]] = {
    ("int4_groups", 2): ["-DRADIXLM_INT4_PATH=2"],
    ("int4_groups", 1): ["-DRADIXLM_INT4_PATH=1"],
    ("int8_groups", 1): ["-mno-avx512f", "-DRADIXLM_INT8_GROUPS_PATH=1"],
    ("int8_groups", 0): ["-mno-avx2", "-mno-avx512f", "-DRADIXLM_INT8_GROUPS_PATH=0"],
}


def load_variant(kernel: str, path: int) -> ModuleType:
    """Build (or find built) and import one variant in this process."""
    from torch.utils.cpp_extension import load

    from radixlm.cpu_kernels.build import CFLAGS
    from radixlm.runtime.cache_dir import cache_root

    flags = [*CFLAGS, *VARIANTS[kernel, path], f"-I{KERNELS}"]
    source = KERNELS / f"{kernel}.cpp"
    key = hashlib.sha256(source.read_bytes() + (KERNELS / "simd.h").read_bytes()
                         + " ".join(flags).encode()).hexdigest()[:12]
    build_dir = cache_root() / "cpu_kernels" / f"{kernel}_path{path}-{key}"
    build_dir.mkdir(parents=True, exist_ok=True)
    return load(name=f"radixlm_{kernel}_path{path}_{key}", sources=[str(source)],
                extra_cflags=flags, extra_ldflags=["-fopenmp"],
                build_directory=str(build_dir), verbose=False)


@functools.cache
def _build_all() -> None:
    """Every variant built in its own process, all at once (a failure shows when the test
    loads that variant in-process)."""
    def build(spec: tuple[str, int]) -> None:
        code = f"from tests.kernel_variants import load_variant; load_variant{spec!r}"
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True)

    with ThreadPoolExecutor(len(VARIANTS)) as pool:
        list(pool.map(build, VARIANTS))


def variant(kernel: str, path: int) -> ModuleType:
    _build_all()
    return load_variant(kernel, path)
