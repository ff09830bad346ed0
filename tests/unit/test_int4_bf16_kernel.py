"""The int4_bf16 C++ kernel (cpu_kernels/int4_bf16.cpp) and its weight layout
(models/linear/int4_bf16_blocks.py).

The kernel computes x @ (d q + m).T with x unquantized (bf16 products, float32 sums; the
nibbles read as 128 + q, the offset in the group term). Against a float64 reference of
the dequantized weights times the bf16 activations: float32 summation and the offset's
cancellation only (~1e-5 of sum |x| |w|), plus the bf16 rounding of the output for bf16
x. float32 x goes in as two bf16 halves (~2^-16 relative per element)."""

from __future__ import annotations

import pytest
import torch

from radixlm.models.linear.int4 import int4_bf16_kernel
from radixlm.models.linear.int4_bf16_blocks import (block_scales, pack_bf16_blocks,
                                                     unblock_scales, unpack_bf16_blocks)
from radixlm.models.linear.int4_groups import Int4Groups

kernel = int4_bf16_kernel()
needs_kernel = pytest.mark.skipif(kernel is None, reason="int4_bf16 needs AVX512-BF16")


@pytest.fixture(params=["built", "avx512"])
def built_or_avx512(request):
    """The kernel as built here (AMX tiles where the CPU has them: path 2), and on an AMX
    CPU also its AVX512-BF16 loops (built with -DRADIXLM_INT4_AMX=0), which CPUs without
    AMX run."""
    if request.param == "built":
        return kernel
    if kernel.int4_bf16_path() != 2:
        pytest.skip("the built kernel is the AVX512-BF16 path already")
    from tests.kernel_variants import variant

    return variant("int4_bf16", 1)


def _groups(n: int, k: int, g: torch.Generator) -> Int4Groups:
    """Random Q4_1-like groups (float16-exact d and m)."""
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    d = (torch.rand(n, k // 32, generator=g) * 0.02 + 1e-3).half().float()
    m = (-8 * d + torch.randn(n, k // 32, generator=g) * 0.01).half().float()
    return Int4Groups(q, d, m)


@pytest.mark.parametrize("n,k", [(16, 32), (33, 96), (40, 224), (7, 576)])
def test_pack_round_trip(n: int, k: int) -> None:
    groups = _groups(n, k, torch.Generator().manual_seed(n + k))
    p = pack_bf16_blocks(groups.q)
    assert p.shape == (-(-n // 16), k * 8) and p.dtype == torch.uint8
    assert torch.equal(unpack_bf16_blocks(p, n), groups.q)
    d, m = block_scales(groups.d, groups.m)
    assert d.shape == (-(-n // 16), k // 32, 16)
    d2, m2 = unblock_scales(d, m, n)
    assert torch.equal(d2, groups.d) and torch.equal(m2, groups.m)


def test_pack_layout() -> None:
    """Byte 16 t + 8 h1 + s of a chunk: low nibble register h1, high nibble 2 + h1, at lane
    L = 8 t + s = channel L // 2, column 2 r + L % 2."""
    q = torch.zeros(16, 32, dtype=torch.uint8)
    q[5, 8 + 3] = 7    # chunk 1, column 3: r = 1, L % 2 = 1, L = 11: t 1, s 3 -> byte 27 low
    q[0, 16 + 6] = 9   # chunk 2, column 6: r = 3, L = 0 -> h1 1, byte 8 high
    p = pack_bf16_blocks(q)[0]
    assert p[64 + 27] == 7 and p[128 + 8] == 9 << 4 and int(p.sum()) == 7 + (9 << 4)


def _check(module, dtype: torch.dtype, m: int, n: int, k: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    groups = _groups(n, k, g)
    d, mm = block_scales(groups.d, groups.m)
    x = (torch.randn(m, k, generator=g) * 2).to(dtype)
    y = module.int4_bf16_matmul(x, pack_bf16_blocks(groups.q), d, mm, n)
    assert y.shape == (m, n) and y.dtype == dtype
    w = groups.dequantize().double()
    ref = x.double() @ w.T
    scale = x.double().abs() @ w.abs().T
    out_round = 2.0 ** -8 * ref.abs() if dtype == torch.bfloat16 else 0
    err = (y.double() - ref).abs()
    assert (err <= 2e-5 * scale + out_round + 1e-30).all(), float((err / scale).max())


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8, 9, 17])
@pytest.mark.parametrize("n,k", [(40, 96), (33, 224), (64, 576), (100, 1536)])
def test_matmul_against_reference(built_or_avx512, dtype: torch.dtype, m: int, n: int,
                                  k: int) -> None:
    _check(built_or_avx512, dtype, m, n, k, seed=m * 1000 + n + k)


@needs_kernel
def test_summation_error_is_float32_sized(built_or_avx512) -> None:
    """bf16-exact x as float32 (no split, float32 output): the kernel's own error, the 128
    offset's cancellation included, stays ~1e-5 of sum |x| |w| (bf16 x alone: 4e-3)."""
    g = torch.Generator().manual_seed(1)
    groups = _groups(960, 576, g)
    d, mm = block_scales(groups.d, groups.m)
    x = torch.randn(4, 576, generator=g).bfloat16().float()
    y = built_or_avx512.int4_bf16_matmul(x, pack_bf16_blocks(groups.q), d, mm, 960)
    w = groups.dequantize().double()
    rel = ((y.double() - x.double() @ w.T).abs() / (x.double().abs() @ w.abs().T)).max()
    assert rel < 1e-5, float(rel)


@needs_kernel
def test_linear_method_and_custom_op() -> None:
    from radixlm.models.linear.int4 import Int4GroupwiseLinear
    from radixlm.models.linear.method import DenseLinear

    groups = _groups(50, 96, torch.Generator().manual_seed(3))
    lin = Int4GroupwiseLinear(groups, DenseLinear(groups.dequantize().bfloat16()), max_m=8,
                              use_bf16=True)
    assert torch.equal(lin.dequantized_weight(), groups.dequantize())
    x = torch.randn(3, 96).bfloat16()
    y = lin(x)
    assert torch.equal(y, torch.ops.radixlm.int4_bf16_matmul(x, lin.q_bf16, lin.d, lin.m, 50))
    ref = x.double() @ groups.dequantize().double().T
    assert ((y.double() - ref).abs() <= 2.0 ** -8 * ref.abs() + 1e-3).all()
    assert lin.kernel_bytes() == 64 * 96 // 2 + 2 * 4 * 64 * 3


@needs_kernel
def test_traces_under_torch_compile_as_the_custom_op() -> None:
    """A compiled graph holds `radixlm::int4_bf16_matmul` (dynamo cannot trace the pybind
    call): fullgraph, the same values as eager."""
    from radixlm.models.linear.int4 import Int4GroupwiseLinear
    from radixlm.models.linear.method import DenseLinear

    groups = _groups(48, 64, torch.Generator().manual_seed(6))
    lin = Int4GroupwiseLinear(groups, DenseLinear(groups.dequantize().bfloat16()), max_m=8,
                              use_bf16=True)
    x = torch.randn(2, 64).bfloat16()
    torch._dynamo.reset()
    compiled = torch.compile(lin, backend="eager", fullgraph=True)
    assert torch.equal(compiled(x), lin(x))


@needs_kernel
def test_rows_equal_single_row_calls_bit_for_bit(built_or_avx512) -> None:
    """A call of 1..9 rows gives each row exactly what a one-row call gives it (a
    speculative verify of up to 8 rows must reproduce its decode steps' logits)."""
    g = torch.Generator().manual_seed(5)
    n, k = 96, 256
    groups = _groups(n, k, g)
    d, mm = block_scales(groups.d, groups.m)
    w = pack_bf16_blocks(groups.q)
    # A wide exponent range (as real activations' outliers), so that float32 sums of a
    # group's products round, and their order shows.
    scale = torch.exp2(torch.randint(-12, 13, (9, k), generator=g).float())
    x = (torch.randn(9, k, generator=g) * scale).bfloat16()
    mod = built_or_avx512
    one = torch.cat([mod.int4_bf16_matmul(x[i:i + 1].contiguous(), w, d, mm, n)
                     for i in range(9)])
    for m in range(2, 10):
        assert torch.equal(mod.int4_bf16_matmul(x[:m].contiguous(), w, d, mm, n), one[:m]), m
