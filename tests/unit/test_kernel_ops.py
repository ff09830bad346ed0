"""The C++ kernels' entries as torch ops (cpu_kernels/kernel_ops.py): every `radixlm::`
op has its CPU implementation from the kernel's main build (the C++ source, not Python:
a compiled decode graph's call goes through no Python), including after another build of
the same source (a test variant) loaded in the same process; a compiled graph calling one
equals the kernel called directly."""

from __future__ import annotations

import pytest
import torch

import radixlm.cpu_kernels.ops  # noqa: F401  (defines paged_decode_attention)
import radixlm.models.linear.bf16_tiles  # noqa: F401  (each module defines its ops)
import radixlm.models.linear.groups_f32 as groups_f32
import radixlm.models.linear.int4  # noqa: F401
import radixlm.models.linear.int8_groups  # noqa: F401
import radixlm.models.linear.q5_bf16  # noqa: F401
from radixlm.cpu_kernels.build import load_kernel
from tests.kernel_variants import load_variant, needs_build

# op -> the kernel whose library implements it
OPS = {
    "paged_decode_attention": "decode_attention",
    "int4_f32_matmul": "groups_f32", "int4_f32_q8_matmul": "groups_f32",
    "int8_f32_matmul": "groups_f32",
    "int4_group_matmul": "int4_groups", "int4_bf16_matmul": "int4_bf16",
    "int8_group_matmul": "int8_groups", "q5_bf16_matmul": "q5_bf16",
    "bf16_tiles_matmul": "bf16_tiles", "int4_tiles_matmul": "bf16_tiles",
    "int8_tiles_matmul": "bf16_tiles", "q5_tiles_matmul": "bf16_tiles",
}


def cpu_registration(op: str) -> str | None:
    lines = torch._C._dispatch_dump(f"radixlm::{op}").splitlines()
    cpu = [line for line in lines if line.startswith("CPU:")]
    assert len(cpu) <= 1, lines
    return cpu[0] if cpu else None


def test_every_op_is_implemented_by_its_kernels_main_build() -> None:
    defined = {name.removeprefix("radixlm::") for name in torch._C._dispatch_get_all_op_names()
               if name.startswith("radixlm::")}
    assert defined == set(OPS), "an op without its entry here (or the reverse)"
    loaded = {kernel for kernel in set(OPS.values()) if load_kernel(kernel) is not None}
    if not loaded:
        pytest.skip("no C++ kernel built here")
    for op, kernel in OPS.items():
        if kernel in loaded:
            where = cpu_registration(op)
            assert where is not None and f"/{kernel}-" in where and f"/{kernel}.cpp:" in where, \
                (op, where)


def test_another_build_of_a_source_takes_no_op_over() -> None:
    spec = ("int4_groups", 1)
    if load_kernel("int4_groups") is None or not needs_build(spec):
        pytest.skip("no narrower int4_groups build on this CPU")
    load_variant(*spec)
    assert "/int4_groups-" in cpu_registration("int4_group_matmul")


def test_compiled_graph_calls_the_kernel() -> None:
    kernel = groups_f32.groups_f32_kernel()
    if kernel is None:
        pytest.skip("groups_f32 needs AVX2, FMA, F16C")
    n, k = 40, 64
    gen = torch.Generator().manual_seed(0)
    w = groups_f32.pack_int4_f32(torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=gen))
    d, m = groups_f32.block_scales_f32(torch.rand(n, k // 32, generator=gen),
                                       torch.rand(n, k // 32, generator=gen))
    x = torch.randn(3, k, generator=gen)

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.radixlm.int4_f32_matmul(x * 2, w, d, m, n) + 1

    compiled = torch.compile(f, fullgraph=True, dynamic=False)
    assert torch.equal(compiled(x), kernel.int4_f32_matmul(x * 2, w, d, m, n) + 1)
