"""What the CPU can do, from the "flags" line of /proc/cpuinfo (Linux; elsewhere: nothing).

`--dtype auto` picks bfloat16 on a CPU with native bf16 dot products (AMX-BF16 or
AVX512-BF16) and float32 elsewhere: without them the bf16 GEMMs are emulated and float32
measured several times faster (docs/benchmarks.md, "dtype on the CPU"). Benchmark records
carry `cpu_summary()` so two result lines can be told apart.
"""

from __future__ import annotations

import functools

CPUINFO = "/proc/cpuinfo"
# Either gives the CPU native bf16 dot products (oneDNN uses them for bf16 GEMMs).
FAST_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
# Any gives int8 dot products with 32-bit sums (what oneDNN's int8 GEMM needs to be exact).
INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
# The flags that matter for LLM kernels on x86, for benchmark records.
SUMMARY_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_vnni",
                 "avx_vnni")


def parse_cpuinfo(text: str) -> tuple[str | None, frozenset[str]]:
    """(model name, flags) of the first processor listed in /proc/cpuinfo text."""
    model: str | None = None
    flags: frozenset[str] | None = None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key == "flags" and flags is None:
            flags = frozenset(value.split())
        if model is not None and flags is not None:
            break
    return model, flags or frozenset()


@functools.cache
def _cpuinfo() -> tuple[str | None, frozenset[str]]:
    try:
        with open(CPUINFO) as f:
            return parse_cpuinfo(f.read())
    except OSError:  # not Linux, or no /proc
        return None, frozenset()


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (e.g. "avx2", "avx512_bf16"); empty where unknown."""
    return _cpuinfo()[1]


def machine_key() -> str:
    """The CPU's model name and all its flags as one string: what code compiled with
    -march=native depends on (build caches key on it; read from /proc/cpuinfo itself, so
    it always names the real CPU)."""
    model, flags = _cpuinfo()
    return f"{model}|{' '.join(sorted(flags))}"


def int8_dot_products() -> bool:
    """Does the CPU have one of INT8_DOT_FLAGS? Without them oneDNN's int8 GEMM sums u8 x s8
    pairs in saturating 16-bit lanes (AVX2's vpmaddubsw): 7% off the exact product on
    random rows. Read from /proc/cpuinfo itself, as `machine_key` (it decides whether a
    method is correct, which tests must not blank)."""
    flags = _cpuinfo()[1]
    return any(f in flags for f in INT8_DOT_FLAGS)


def fast_bf16_flags() -> list[str]:
    """Which of FAST_BF16_FLAGS the CPU has (empty: no native bf16 dot products)."""
    flags = cpu_flags()
    return [f for f in FAST_BF16_FLAGS if f in flags]


def cpu_summary() -> dict[str, object]:
    """The CPU's model name and which of SUMMARY_FLAGS it has, for benchmark records."""
    flags = cpu_flags()
    return {"model": _cpuinfo()[0], "flags": {f: f in flags for f in SUMMARY_FLAGS}}
