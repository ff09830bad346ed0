"""The CPU probe (radixlm/runtime/cpu_features.py) and `--dtype auto` by capability. The probe is
always patched: nothing here depends on this machine's CPU."""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime import cpu_features
from radixlm.runtime.device import choose_dtype, resolve_dtype

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2
"""

CPU = torch.device("cpu")


@pytest.fixture
def flags(monkeypatch):
    def set_flags(*names: str) -> None:
        monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset(names))
    return set_flags


def test_parse_cpuinfo_reads_the_first_processor():
    model, flags = cpu_features.parse_cpuinfo(CPUINFO)
    assert model == "Intel(R) Xeon(R) Platinum 8480+"
    assert {"avx2", "avx512_bf16", "amx_bf16", "amx_tile"} <= flags and "fpu" in flags
    assert cpu_features.parse_cpuinfo("") == (None, frozenset())


def test_unreadable_cpuinfo_means_no_flags(monkeypatch):
    monkeypatch.setattr(cpu_features, "CPUINFO", "/nonexistent/cpuinfo")
    cpu_features._cpuinfo.cache_clear()
    try:
        assert cpu_features._cpuinfo() == (None, frozenset())
    finally:
        cpu_features._cpuinfo.cache_clear()


def test_fast_bf16_and_summary(flags):
    flags("avx2", "avx512f", "amx_bf16", "amx_tile")
    assert cpu_features.fast_bf16_flags() == ["amx_bf16"]
    summary = cpu_features.cpu_summary()
    assert set(summary) == {"model", "flags"}
    assert summary["flags"] == {"avx2": True, "avx512f": True, "avx512_bf16": False,
                                "amx_bf16": True, "amx_tile": True, "avx512_vnni": False,
                                "avx_vnni": False}
    flags("avx2")
    assert not cpu_features.fast_bf16_flags()


@pytest.mark.parametrize("cpu_flags, want, reason", [
    (("avx2", "avx512f", "amx_bf16", "amx_tile"), torch.bfloat16, "CPU has amx_bf16"),
    (("avx2", "avx512f", "avx512_bf16"), torch.bfloat16, "CPU has avx512_bf16"),
    (("avx512_bf16", "amx_bf16"), torch.bfloat16, "CPU has amx_bf16 and avx512_bf16"),
    (("avx2", "avx512f"), torch.float32, "CPU has neither amx_bf16 nor avx512_bf16"),
    (("avx2",), torch.float32, "CPU has neither amx_bf16 nor avx512_bf16"),
    ((), torch.float32, "CPU has neither amx_bf16 nor avx512_bf16"),
])
def test_auto_on_the_cpu_follows_the_flags(flags, cpu_flags, want, reason):
    flags(*cpu_flags)
    assert choose_dtype("auto", CPU) == (want, reason)
    assert resolve_dtype("auto", CPU) == want


def test_auto_on_cuda_is_bfloat16_whatever_the_cpu(flags):
    flags("avx2")
    assert choose_dtype("auto", torch.device("cuda")) == (torch.bfloat16, "CUDA")


@pytest.mark.parametrize("name, want", [("float32", torch.float32),
                                        ("bfloat16", torch.bfloat16),
                                        ("float16", torch.float16)])
def test_explicit_dtype_is_kept(flags, name, want):
    for cpu_flags in (("avx2",), ("avx512_bf16", "amx_bf16")):
        flags(*cpu_flags)
        for device in (CPU, torch.device("cuda")):
            assert choose_dtype(name, device) == (want, "given by --dtype")
