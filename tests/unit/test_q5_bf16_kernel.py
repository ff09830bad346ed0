"""The q5_bf16 C++ kernel (cpu_kernels/q5_bf16.cpp), its weight layout
(models/linear/q5_bf16_blocks.py) and Q5GroupwiseLinear (models/linear/q5_bf16.py).

GGUF Q5_0 blocks -> Int8Groups -> the 5-bit form: dequantization equal to the `gguf`
package's bit for bit. The kernel computes x @ (d (q - 16)).T with x unquantized (bf16
products, float32 sums; the values read as 128 + q, the offset in the group term):
against a float64 reference, float32 summation and the offset's cancellation only
(~1e-5 of sum |x| |w|), plus the bf16 rounding of the output for bf16 x."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize as gguf_dequantize

from radixlm.models import gguf_int8
from radixlm.models.linear.int8_groups import Int8Groups
from radixlm.models.linear.method import DenseLinear
from radixlm.models.linear.q5_bf16 import Q5GroupwiseLinear, fits_q5, q5_bf16_kernel
from radixlm.models.linear.q5_bf16_blocks import (pack_q5_blocks, q5_bytes, q5_scales,
                                                   q5_unblock_scales, unpack_q5_blocks)
from tests.unit.test_gguf_dequant import _random_blocks

kernel = q5_bf16_kernel()
needs_kernel = pytest.mark.skipif(kernel is None, reason="q5_bf16 needs AVX512-BF16")


def _groups(n: int, k: int, g: torch.Generator) -> Int8Groups:
    """Random Q5_0-like groups: q in -16..15, float16-exact d."""
    q = torch.randint(-16, 16, (n, k), generator=g, dtype=torch.int8)
    d = (torch.rand(n, k // 32, generator=g) * 0.02 + 1e-3).half().float()
    return Int8Groups(q, d, 32)


@pytest.mark.parametrize("n,k", [(16, 32), (33, 96), (40, 224), (7, 576)])
def test_pack_round_trip(n: int, k: int) -> None:
    q = torch.randint(0, 32, (n, k), generator=torch.Generator().manual_seed(n + k),
                      dtype=torch.uint8)
    p = pack_q5_blocks(q)
    assert p.shape == (-(-n // 16), k // 32 * 320) and p.dtype == torch.uint8
    assert torch.equal(unpack_q5_blocks(p, n), q)
    d = torch.rand(n, k // 32).half().float()
    assert q5_scales(d).shape == (-(-n // 16), k // 32, 16)
    assert torch.equal(q5_unblock_scales(q5_scales(d), n), d)
    assert p.numel() + q5_scales(d).numel() * 2 == q5_bytes(n, k)


def test_pack_layout() -> None:
    """The nibbles as int4_bf16 lays them out, bit 4 in the group's masks: channel 5,
    column 11 (chunk 1, byte 27's low nibble) and channel 0, column 22 (chunk 2, byte 8's
    high nibble)."""
    q = torch.zeros(16, 32, dtype=torch.uint8)
    q[5, 8 + 3] = 16 + 7
    q[0, 16 + 6] = 16 + 9
    p = pack_q5_blocks(q)[0]
    assert p[64 + 27] == 7 and p[128 + 8] == 9 << 4
    # masks of chunk c at 256 + 16 c: low-nibble mask, then high-nibble mask
    assert p[256 + 16 + 27 // 8] == 1 << (27 % 8) and p[256 + 32 + 8 + 1] == 1
    assert int(p.sum()) == 7 + (9 << 4) + (1 << 3) + 1


def test_q5_0_blocks_dequantize_bit_for_bit() -> None:
    """GGUF Q5_0 -> Int8Groups -> the method's 5-bit form -> dense: the gguf package's."""
    if kernel is None:
        pytest.skip("q5_bf16 needs AVX512-BF16")
    rows, cols = 37, 320
    raw = _random_blocks(T.Q5_0, rows * cols // 32, seed=11)
    groups = gguf_int8.int8_groups_from_blocks(raw.reshape(rows, -1), T.Q5_0, rows, cols)
    assert fits_q5(groups)
    ref = torch.from_numpy(np.ascontiguousarray(
        gguf_dequantize(raw.reshape(rows, -1), T.Q5_0).reshape(rows, cols)))
    lin = Q5GroupwiseLinear(groups, DenseLinear(ref.bfloat16()), max_m=8)
    assert torch.equal(lin.dequantized_weight(), ref)


def test_fits_q5_refuses_other_groups() -> None:
    g = torch.Generator().manual_seed(2)
    groups = _groups(16, 64, g)
    assert fits_q5(groups)
    q8 = groups.q.clone()
    q8[3, 5] = 16
    assert not fits_q5(Int8Groups(q8, groups.s, 32))
    assert not fits_q5(Int8Groups(groups.q, groups.s + 1e-7, 32))  # not float16 values
    assert not fits_q5(Int8Groups(groups.q, torch.cat([groups.s, groups.s], 1), 16))


def _check(dtype: torch.dtype, m: int, n: int, k: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    groups = _groups(n, k, g)
    x = (torch.randn(m, k, generator=g) * 2).to(dtype)
    p = pack_q5_blocks(groups.q.to(torch.int16) + 16)
    y = kernel.q5_bf16_matmul(x, p, q5_scales(groups.s), n)
    assert y.shape == (m, n) and y.dtype == dtype
    w = groups.dequantize().double()
    ref = x.double() @ w.T
    scale = x.double().abs() @ w.abs().T
    out_round = 2.0 ** -8 * ref.abs() if dtype == torch.bfloat16 else 0
    err = (y.double() - ref).abs()
    assert (err <= 2e-5 * scale + out_round + 1e-30).all(), float((err / scale).max())


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 8, 9, 17])
@pytest.mark.parametrize("n,k", [(40, 96), (33, 224), (64, 640), (100, 1536), (7, 32)])
def test_matmul_against_reference(dtype: torch.dtype, m: int, n: int, k: int) -> None:
    _check(dtype, m, n, k, seed=m * 1000 + n + k)


@needs_kernel
def test_summation_error_is_float32_sized() -> None:
    """bf16-exact x as float32 (no split, float32 output): the kernel's own error, the 144
    offset's cancellation included, stays ~1e-5 of sum |x| |w|."""
    g = torch.Generator().manual_seed(1)
    groups = _groups(1024, 640, g)
    x = torch.randn(4, 640, generator=g).bfloat16().float()
    y = kernel.q5_bf16_matmul(x, pack_q5_blocks(groups.q.to(torch.int16) + 16),
                              q5_scales(groups.s), 1024)
    w = groups.dequantize().double()
    rel = ((y.double() - x.double() @ w.T).abs() / (x.double().abs() @ w.abs().T)).max()
    assert rel < 1e-5, float(rel)


@needs_kernel
@pytest.mark.parametrize("m", [1, 8, 9])
def test_linear_method_small_calls_and_fallback(m: int) -> None:
    groups = _groups(50, 96, torch.Generator().manual_seed(3))
    fallback = DenseLinear(groups.dequantize().bfloat16())
    lin = Q5GroupwiseLinear(groups, fallback, max_m=8)
    x = torch.randn(m, 96).bfloat16()
    y = lin(x)
    if m > 8:  # the dense fallback (its bf16-rounded weights)
        assert torch.equal(y, fallback(x)) and lin.bytes_read(m) == fallback.bytes_read(m)
        return
    assert torch.equal(y, torch.ops.radixlm.q5_bf16_matmul(x, lin.q5, lin.d, 50))
    assert lin.bytes_read(m) == 64 * 3 * (320 // 16 + 2)
    ref = x.double() @ groups.dequantize().double().T
    assert ((y.double() - ref).abs() <= 2.0 ** -8 * ref.abs() + 1e-3).all()


@needs_kernel
def test_traces_under_torch_compile_as_the_custom_op() -> None:
    groups = _groups(48, 64, torch.Generator().manual_seed(6))
    lin = Q5GroupwiseLinear(groups, DenseLinear(groups.dequantize().bfloat16()), max_m=8)
    x = torch.randn(2, 64).bfloat16()
    torch._dynamo.reset()
    compiled = torch.compile(lin, backend="eager", fullgraph=True)
    assert torch.equal(compiled(x), lin(x))
