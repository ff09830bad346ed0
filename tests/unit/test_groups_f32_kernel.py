"""The groups_f32 C++ kernel (cpu_kernels/groups_f32.cpp: int4 and int8 groups x float32
activations, AVX2) and its layouts (models/linear/groups_f32.py).

Against a float64 reference of the dequantized weights times x: the kernel multiplies
exact q values by float32 x and sums in float32, so its error is float32 summation's
(~1e-6 of sum |x| |w|); a row's result must not depend on how many rows the call has.
Its int8-activation calls (int4_f32_q8_matmul) against the same formula on x quantized
as llama.cpp does (computed here in torch): exact integer dots, float32 sums; and against
x itself within the activation rounding's bound."""

from __future__ import annotations

import pytest
import torch

from radixlm.models.linear.groups_f32 import (block_scales_f32, groups_f32_kernel,
                                              int8_f32_rows, pack_int4_f32, pack_int8_f32,
                                              unblock_scales_f32, unpack_int4_f32,
                                              unpack_int8_f32)
from radixlm.models.linear.int4_groups import Int4Groups
from radixlm.models.linear.int8_groups import Int8Groups, Int8GroupwiseLinear
from radixlm.models.linear.method import DenseLinear

kernel = groups_f32_kernel()
needs_kernel = pytest.mark.skipif(kernel is None, reason="groups_f32 needs AVX2, FMA, F16C")


def _int4(n: int, k: int, g: torch.Generator, f16: bool = True) -> Int4Groups:
    """Random Q4_1-like groups: float16-exact d and m (Q4_K-like float32 ones: f16=False)."""
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    d = torch.rand(n, k // 32, generator=g) * 0.02 + 1e-3
    m = -8 * d + torch.randn(n, k // 32, generator=g) * 0.01
    if f16:
        d, m = d.half().float(), m.half().float()
    return Int4Groups(q, d, m)


def _int8(n: int, k: int, group: int, g: torch.Generator) -> Int8Groups:
    q = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    s = (torch.rand(n, k // group, generator=g) * 0.01 + 1e-4).half().float()
    return Int8Groups(q, s, group)


def _within_f32_rounding(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    ref = x.double() @ w.double().T
    scale = x.double().abs() @ w.double().abs().T
    err = (y.double() - ref).abs()
    assert (err <= 1e-5 * scale + 1e-30).all(), float((err / scale).max())


@pytest.mark.parametrize("n,k", [(8, 32), (13, 64), (40, 224), (7, 576)])
def test_pack_round_trips(n: int, k: int) -> None:
    g = torch.Generator().manual_seed(n + k)
    int4 = _int4(n, k, g)
    p = pack_int4_f32(int4.q)
    assert p.shape == (-(-n // 8), k) and p.dtype == torch.int32
    assert torch.equal(unpack_int4_f32(p, n), int4.q)
    d, m = block_scales_f32(int4.d, int4.m)
    assert d.dtype == torch.float16 and d.shape == (-(-n // 8), k // 32, 8)
    assert torch.equal(unblock_scales_f32(d, n), int4.d)
    assert torch.equal(unblock_scales_f32(m, n), int4.m)
    # Scales float16 cannot hold stay float32.
    assert block_scales_f32(_int4(n, k, g, f16=False).d)[0].dtype == torch.float32
    int8 = _int8(n, k, 32, g)
    p8 = pack_int8_f32(int8.q)
    assert p8.shape == (-(-n // 8), k, 8) and torch.equal(unpack_int8_f32(p8, n), int8.q)
    (s,) = block_scales_f32(int8.s)
    ids = torch.tensor([n - 1, 0, n // 2])
    rows, row_scales = int8_f32_rows(p8, s, ids)
    assert torch.equal(rows, int8.q[ids]) and torch.equal(row_scales, int8.s[ids])


def test_int4_layout() -> None:
    """Lane j of word c holds channel 8 b + j's column 8 c + t in bits 4 t .. 4 t + 3."""
    q = torch.zeros(16, 32, dtype=torch.uint8)
    q[9, 8 * 2 + 5] = 7   # block 1, lane 1, word 2, t 5
    p = pack_int4_f32(q)
    assert int(p[1, 2 * 8 + 1]) == 7 << 20 and int((p != 0).sum()) == 1


@needs_kernel
@pytest.mark.parametrize("f16", [True, False])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 9, 33])
@pytest.mark.parametrize("n,k", [(40, 96), (13, 224), (64, 576), (100, 1536)])
def test_int4_matmul_against_reference(f16: bool, m: int, n: int, k: int) -> None:
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    groups = _int4(n, k, g, f16)
    d, mm = block_scales_f32(groups.d, groups.m)
    x = torch.randn(m, k, generator=g) * 2
    y = kernel.int4_f32_matmul(x, pack_int4_f32(groups.q), d, mm, n)
    assert y.shape == (m, n) and y.dtype == torch.float32
    _within_f32_rounding(y, x, groups.dequantize())


def _quantized_x(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] per group of 32 -> (q [M, K] as float64, scale [M, groups], sum [M, groups]):
    scale max|x| / 127, q = x * (1 / scale) rounded to float32 then to even."""
    xg = x.view(x.shape[0], -1, 32)
    sx = xg.abs().amax(-1) / 127
    inv = torch.where(sx != 0, 1 / sx, torch.zeros_like(sx))
    q = torch.round(xg * inv[..., None])
    return q.reshape(x.shape).double(), sx, xg.sum(-1)


@needs_kernel
@pytest.mark.parametrize("f16", [True, False])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 9, 33])
@pytest.mark.parametrize("n,k", [(40, 96), (13, 224), (64, 576), (100, 1536)])
def test_int4_q8_matmul_against_reference(f16: bool, m: int, n: int, k: int) -> None:
    g = torch.Generator().manual_seed(m * 1000 + n + k + 7)
    groups = _int4(n, k, g, f16)
    d, mm = block_scales_f32(groups.d, groups.m)
    x = torch.randn(m, k, generator=g) * 2
    x[0, :32] = 0                                   # an all-zero group: scale 0
    y = kernel.int4_f32_q8_matmul(x, pack_int4_f32(groups.q), d, mm, n)
    assert y.shape == (m, n) and y.dtype == torch.float32
    xq, sx, sums = _quantized_x(x)
    ng = k // 32
    dots = torch.einsum("ngk,mgk->mng", groups.q.double().view(n, ng, 32), xq.view(m, ng, 32))
    terms = dots * groups.d.double()[None] * sx.double()[:, None]
    mterm = groups.m.double()[None] * sums.double()[:, None]
    ref, mag = (terms + mterm).sum(-1), (terms.abs() + mterm.abs()).sum(-1)
    assert ((y.double() - ref).abs() <= 1e-5 * mag + 1e-30).all()
    # Against x unquantized: each xq within half a step of x / sx.
    w = groups.dequantize().double()
    step = sx.double().repeat_interleave(32, dim=1)
    bound = 0.5 * step @ (groups.q.double() * groups.d.double().repeat_interleave(32, dim=1)).t()
    assert ((y.double() - x.double() @ w.t()).abs() <= bound + 1e-5 * mag).all()


@needs_kernel
@pytest.mark.parametrize("group", [16, 32])
@pytest.mark.parametrize("m", [1, 3, 4, 6, 17])
@pytest.mark.parametrize("n,k", [(40, 96), (13, 224), (100, 576)])
def test_int8_matmul_against_reference(group: int, m: int, n: int, k: int) -> None:
    g = torch.Generator().manual_seed(m * 1000 + n + k + group)
    groups = _int8(n, k, group, g)
    (s,) = block_scales_f32(groups.s)
    x = torch.randn(m, k, generator=g)
    y = kernel.int8_f32_matmul(x, pack_int8_f32(groups.q), s, group, n)
    _within_f32_rounding(y, x, groups.dequantize())


@needs_kernel
def test_rows_equal_single_row_calls_bit_for_bit() -> None:
    """Each row's sums run in one order whatever M (4-row, 2-row and 1-row blocks, 4 or 2
    or 1 channel blocks at once; x int8 or not): a speculative verify's rows equal its
    decode steps."""
    g = torch.Generator().manual_seed(5)
    int4, int8 = _int4(200, 576, g), _int8(200, 576, 32, g)
    d, mm = block_scales_f32(int4.d, int4.m)
    (s,) = block_scales_f32(int8.s)
    w4, w8 = pack_int4_f32(int4.q), pack_int8_f32(int8.q)
    x = torch.randn(11, 576, generator=g)
    for call in (lambda r: kernel.int4_f32_matmul(r, w4, d, mm, 200),
                 lambda r: kernel.int4_f32_q8_matmul(r, w4, d, mm, 200),
                 lambda r: kernel.int8_f32_matmul(r, w8, s, 32, 200)):
        whole = call(x)
        for i in range(11):
            assert torch.equal(whole[i:i + 1], call(x[i:i + 1].contiguous()))
        assert torch.equal(whole[3:8], call(x[3:8].contiguous()))


@needs_kernel
def test_refuses_what_it_cannot_compute() -> None:
    groups = _int4(16, 64, torch.Generator().manual_seed(0))
    w = pack_int4_f32(groups.q)
    d, mm = block_scales_f32(groups.d, groups.m)
    with pytest.raises(RuntimeError, match="float32"):
        kernel.int4_f32_matmul(torch.randn(1, 64).bfloat16(), w, d, mm, 16)
    with pytest.raises(RuntimeError, match="multiple"):
        kernel.int4_f32_matmul(torch.randn(1, 48), w, d, mm, 16)
    with pytest.raises(RuntimeError, match="float32"):
        kernel.int4_f32_q8_matmul(torch.randn(1, 64).bfloat16(), w, d, mm, 16)
    with pytest.raises(RuntimeError, match="multiple"):
        kernel.int4_f32_q8_matmul(torch.randn(1, 48), w, d, mm, 16)
    with pytest.raises(RuntimeError, match="groups of 16 or 32"):
        kernel.int8_f32_matmul(torch.randn(1, 64), w, d, 64, 16)


@needs_kernel
def test_int4_method_kernel_then_fallback_and_compiled_op() -> None:
    from radixlm.models.linear.int4 import Int4GroupwiseLinear

    groups = _int4(50, 96, torch.Generator().manual_seed(3))
    w = groups.dequantize()
    lin = Int4GroupwiseLinear(groups, DenseLinear(w), max_m=4, act_dtype=torch.float32,
                              use_f32=True)
    assert torch.equal(lin.dequantized_weight(), w)
    assert lin.kernel_bytes() == 56 * 96 // 2 + 2 * 2 * 56 * 3   # nibbles, float16 d and m
    x = torch.randn(3, 96)
    y = lin(x)
    assert torch.equal(y, torch.ops.radixlm.int4_f32_matmul(x, lin.q_f32, lin.d, lin.m, 50))
    _within_f32_rounding(y, x, w)
    big = torch.randn(6, 96)                     # past max_m: the dense fallback
    assert torch.equal(lin(big), DenseLinear(w)(big))
    torch._dynamo.reset()
    compiled = torch.compile(lin, backend="eager", fullgraph=True)
    assert torch.equal(compiled(x), y)
    with pytest.raises(RuntimeError, match="fallback"):
        Int4GroupwiseLinear(groups, None, max_m=4, act_dtype=torch.float32, use_f32=True)
    # x quantized to int8 per group: the same words, the kernel's other entry, which
    # without a fallback takes every call.
    q8 = Int4GroupwiseLinear(groups, None, max_m=4, act_dtype=torch.float32, use_f32=True,
                             int8_activations=True)
    assert q8.kernel_bytes() == lin.kernel_bytes() and torch.equal(q8.q_f32, lin.q_f32)
    y8 = q8(x)
    assert torch.equal(y8, torch.ops.radixlm.int4_f32_q8_matmul(x, q8.q_f32, q8.d, q8.m, 50))
    assert not torch.equal(y8, y)
    torch.testing.assert_close(y8, y, rtol=0.05, atol=0.05)
    assert torch.equal(q8(big), kernel.int4_f32_q8_matmul(big, q8.q_f32, q8.d, q8.m, 50))
    torch._dynamo.reset()
    assert torch.equal(torch.compile(q8, backend="eager", fullgraph=True)(x), y8)
    with pytest.raises(RuntimeError, match="int8_activations"):
        Int4GroupwiseLinear(groups, DenseLinear(w), max_m=4, int8_activations=True)


@needs_kernel
def test_int8_head_takes_every_call_and_looks_rows_up() -> None:
    """Without a fallback (a float32 run's LM head) every call is the kernel's, and a tied
    embedding's lookup reads the same rows the dense table holds."""
    groups = _int8(70, 64, 32, torch.Generator().manual_seed(4))
    w = groups.dequantize()
    head = Int8GroupwiseLinear(groups, None, max_m=8, act_dtype=torch.float32, use_f32=True)
    assert torch.equal(head.dequantized_weight(), w)
    for m in (1, 40):
        x = torch.randn(m, 64)
        y = head(x)
        assert torch.equal(y, torch.ops.radixlm.int8_f32_matmul(x, head.q_f32, head.s_f32,
                                                                32, 70))
        _within_f32_rounding(y, x, w)
    ids = torch.tensor([[3, 69], [0, 8]])
    assert torch.equal(head.lookup(ids, torch.float32), torch.nn.functional.embedding(ids, w))
