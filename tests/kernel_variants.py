"""The C++ kernels built with narrower instruction sets (the AVX2 and plain-loop paths
that other machines compile), for the kernels' unit tests.

Built by radixlm/cpu_kernels/build.py's builder with extra flags (a variant is its own
kernel name, and its key covers the source, the headers, torch's version, all the flags and
the CPU's flags, as a kernel's does). Only the variants narrower than this CPU's own build
are built: a variant the native build already is (an AVX2-only CPU's int4_groups path 2)
is the native module, one wider than the CPU runs is skipped. The first `variant()` call
builds those at once, one g++ process each (they share the cores instead of queueing);
each test then loads its own (found built).
"""

from __future__ import annotations

import functools
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "radixlm" / "cpu_kernels"
# (kernel, path) -> extra compiler flags; `path` is what the built module reports (for
# the simd.h kernels: the vector width in floats, 8 as an AVX2-only CPU builds them).
VARIANTS: dict[tuple[str, int], tuple[str, ...]] = {
    ("int4_groups", 2): ("-DRADIXLM_INT4_PATH=2",),
    ("int4_groups", 1): ("-DRADIXLM_INT4_PATH=1",),
    ("int8_groups", 1): ("-mno-avx512f", "-DRADIXLM_INT8_GROUPS_PATH=1"),
    ("int8_groups", 0): ("-mno-avx2", "-mno-avx512f", "-DRADIXLM_INT8_GROUPS_PATH=0"),
    ("int4_bf16", 1): ("-DRADIXLM_INT4_AMX=0",),
    ("sampling", 8): ("-DRADIXLM_SIMD_LANES=8",),
    ("decode_attention", 8): ("-DRADIXLM_SIMD_LANES=8",),
    # decode_attention_path() 1 and 0: the bf16 dot-product kernel, and neither bf16 kernel
    # (the float32 block kernel), as CPUs without AMX / without AVX512-BF16 build it.
    ("decode_attention", 1): ("-DRADIXLM_DECODE_AMX=0",),
    ("decode_attention", 0): ("-DRADIXLM_DECODE_AMX=0", "-DRADIXLM_DECODE_DPBF16=0"),
}


# The native build's query of its own path, on the same scale as VARIANTS' paths.
NATIVE_PATH = {"int4_groups": "int4_kernel_path", "int8_groups": "path",
               "int4_bf16": "int4_bf16_path", "decode_attention": "decode_attention_path"}


@functools.cache
def native_path(kernel: str, path: int) -> int | None:
    """Where the kernel as built here stands on the scale of variant (kernel, path): the
    vector width in floats for the simd.h width variants (path 8), else the built module's
    own path query; None where it did not build."""
    from radixlm.cpu_kernels.build import load_kernel
    from radixlm.runtime.cpu_features import cpu_flags

    if path == 8:  # simd.h: 16 lanes where -march=native targets AVX-512F
        return 16 if "avx512f" in cpu_flags() else 8
    module = load_kernel(kernel)
    return None if module is None else int(getattr(module, NATIVE_PATH[kernel])())


def needs_build(spec: tuple[str, int]) -> bool:
    """Is variant `spec` narrower than the native build (so not the native module itself,
    and runnable here)?"""
    native = native_path(*spec)
    return native is not None and native > spec[1]


def load_variant(kernel: str, path: int) -> ModuleType:
    """Build (or find built) and import one variant in this process."""
    from radixlm.cpu_kernels.build import build_extension

    module = build_extension(f"{kernel}_path{path}", KERNELS / f"{kernel}.cpp", VARIANTS[kernel, path])
    if module is None:
        raise RuntimeError(f"variant {kernel} path {path} did not build (its warning says why)")
    return module


@functools.cache
def _build_all() -> None:
    """Every variant built in its own process, all at once (a failure shows when the test
    loads that variant in-process)."""
    def build(spec: tuple[str, int]) -> None:
        code = f"from tests.kernel_variants import load_variant; load_variant{spec!r}"
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True)

    specs = [spec for spec in VARIANTS if needs_build(spec)]
    with ThreadPoolExecutor(max(len(specs), 1)) as pool:
        list(pool.map(build, specs))


def variant(kernel: str, path: int) -> ModuleType:
    """The kernel as a CPU of `path` builds it: the native module where that is this CPU's
    own build; skips the test where this CPU does not run that path."""
    native = native_path(kernel, path)
    if native is None or native < path:
        pytest.skip(f"this CPU does not run {kernel} path {path}")
    if native == path:
        from radixlm.cpu_kernels.build import load_kernel

        return load_kernel(kernel)
    _build_all()
    return load_variant(kernel, path)
