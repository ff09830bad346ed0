"""The int4_groups C++ kernel (cpu_kernels/int4_groups.cpp) and its weight layout
(models/linear/int4_blocks.py).

The kernel quantizes x to int8 per group of 32 and computes
y = sum_g d sx (q . xq) + m S. Against a float64 reference of that formula on the
kernel's own quantized x: float32 summation only (rtol ~1e-5). Against x unquantized:
within the activation rounding's bound sum_k |d q_k| sx_g / 2 (each xq is within half a
step of x / sx). The AVX2 and plain-loop paths are built with -DRADIXLM_INT4_PATH and
must agree with the reference too (they run on any x86-64 with AVX2)."""

from __future__ import annotations

import sys

import pytest
import torch

from radixlm.cpu_kernels.build import load_kernel
from radixlm.models.linear.int4_blocks import compact_scales, pack_blocks, unpack_blocks
from radixlm.models.linear.int4_groups import Int4Groups

kernel = load_kernel("int4_groups")
needs_kernel = pytest.mark.skipif(kernel is None, reason="the int4_groups kernel did not build")


def _groups(n: int, k: int, g: torch.Generator) -> Int4Groups:
    """Random Q4_1-like groups with float16-exact d and m."""
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    d = (torch.rand(n, k // 32, generator=g) * 0.02 + 1e-3).half().float()
    m = (-8 * d + torch.randn(n, k // 32, generator=g) * 0.01).half().float()
    return Int4Groups(q, d, m)


def _reference(groups: Int4Groups, xq: torch.Tensor, sx: torch.Tensor, s: torch.Tensor):
    """float64 y and the sum of |terms| per entry (for the summation tolerance)."""
    n, k = groups.shape
    ng = k // 32
    q = groups.q.double().view(n, ng, 32)
    xg = xq.double().view(-1, ng, 32)
    dots = torch.einsum("ngk,mgk->mng", q, xg)                      # [M, N, G]
    terms = dots * groups.d.double()[None] * sx.double()[:, None]
    mterm = groups.m.double()[None] * s.double()[:, None]
    return (terms + mterm).sum(-1), (terms.abs() + mterm.abs()).sum(-1)


@pytest.mark.parametrize("k", [32, 64, 96, 224, 576, 1536])
def test_pack_blocks_round_trip(k: int) -> None:
    g = torch.Generator().manual_seed(k)
    q = torch.randint(0, 16, (5, k), generator=g, dtype=torch.uint8)
    p = pack_blocks(q)
    assert p.shape == (5, k // 2) and p.dtype == torch.uint8
    assert torch.equal(unpack_blocks(p), q)


def test_pack_blocks_layout() -> None:
    """Byte 4 l + j of a 4-group block: column 4 (l // 4) + j of group l % 4 (low nibble),
    column 16 + 4 (l // 4) + j (high)."""
    q = torch.zeros(1, 128, dtype=torch.uint8)
    q[0, 2 * 32 + 5] = 7          # group 2, column 5: r = 1, j = 1 -> l = 6, byte 25 low
    q[0, 3 * 32 + 16 + 2] = 9     # group 3, column 18: r = 0, j = 2 -> l = 3, byte 14 high
    p = pack_blocks(q)[0]
    assert p[25] == 7 and p[14] == 9 << 4 and int(p.sum()) == 7 + (9 << 4)


def test_compact_scales_keeps_float32_when_half_is_inexact() -> None:
    d = torch.tensor([[0.5, 0.25]])
    assert compact_scales(d, -d)[0].dtype == torch.float16
    d2 = torch.tensor([[0.1, 0.25]])  # 0.1 is not a float16 value
    assert compact_scales(d2, -d2)[0].dtype == torch.float32


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_rows_matches_torch(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(3, 224, generator=g) * 2).to(dtype)
    x[1, :32] = 0  # an all-zero group: scale 0, q 0
    xq, sx, s = kernel.int4_quantize_rows(x, False)
    xf = x.float().view(3, 7, 32)
    d = xf.abs().amax(-1) / 127
    inv = torch.where(d != 0, 1 / d, torch.zeros_like(d))
    ref = torch.round(xf * inv[..., None]).to(torch.int8).view(3, 224)
    assert torch.equal(sx, d)
    assert torch.equal(xq, ref)
    torch.testing.assert_close(s, xf.sum(-1), rtol=1e-6, atol=1e-6)


def _check(mod, dtype: torch.dtype, m: int, n: int, k: int, seed: int, half: bool = True) -> None:
    g = torch.Generator().manual_seed(seed)
    groups = _groups(n, k, g)
    x = torch.randn(m, k, generator=g).to(dtype)
    d, mm = compact_scales(groups.d, groups.m) if half else (groups.d, groups.m)
    y = mod.int4_group_matmul(x, pack_blocks(groups.q), d, mm)
    assert y.dtype == dtype and y.shape == (m, n)
    xq, sx, s = kernel.int4_quantize_rows(x, False)
    ref, mag = _reference(groups, xq, sx, s)
    out_round = 2.0 ** -8 if dtype == torch.bfloat16 else 0.0
    err = (y.double() - ref).abs()
    assert (err <= 1e-5 * mag + out_round * ref.abs() + 1e-30).all(), float(err.max())
    # Against x itself: the activation rounding's bound.
    w = groups.dequantize().double()
    exact = x.double() @ w.t()
    step = sx.double().repeat_interleave(32, dim=1)                 # [M, K]
    wq = (groups.q.double() * groups.d.double().repeat_interleave(32, dim=1)).abs()
    bound = 0.5 * step @ wq.t()
    assert ((y.double() - exact).abs() <= bound + 1e-5 * mag + out_round * exact.abs()).all()


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8, 11, 16])
@pytest.mark.parametrize("n,k", [(40, 576), (13, 224), (24, 1536), (7, 32), (9, 64), (5, 96)])
def test_matmul_against_reference(dtype: torch.dtype, m: int, n: int, k: int) -> None:
    _check(kernel, dtype, m, n, k, seed=m * 1000 + n + k)


@needs_kernel
def test_matmul_float32_scales() -> None:
    """Q4_K-like d * sc (not float16 values) stays float32 and is used as such."""
    _check(kernel, torch.float32, 4, 40, 576, seed=5, half=False)


@needs_kernel
def test_linear_method_uses_kernel_and_keeps_the_weights_exact() -> None:
    from radixlm.models.linear.int4 import Int4GroupwiseLinear
    from radixlm.models.linear.method import DenseLinear

    g = torch.Generator().manual_seed(3)
    groups = _groups(40, 576, g)
    dense = DenseLinear(groups.dequantize().bfloat16())
    lin = Int4GroupwiseLinear(groups, dense, max_m=8, use_blocks=True)
    assert lin._kernel is not None and not hasattr(lin, "kernel_weight")
    assert torch.equal(lin.dequantized_weight(), groups.dequantize())
    assert lin.kernel_bytes() == 40 * 576 // 2 + 2 * 40 * 18 * 2  # nibbles + half d, m
    x = torch.randn(3, 576, generator=g).bfloat16()
    y = lin(x)
    ref = x.double() @ groups.dequantize().double().t()
    assert (y.double() - ref).abs().max() < 0.02 * ref.abs().max()


@needs_kernel
@pytest.mark.skipif(not torch.backends.cpu.get_cpu_capability().startswith("AVX"),
                    reason="the AVX2 path needs an x86-64 CPU with AVX2")
@pytest.mark.parametrize("path", [2, 1])
def test_narrower_paths(path: int) -> None:
    from tests.kernel_variants import variant

    mod = variant("int4_groups", path)
    assert mod.int4_kernel_path() == path
    for m, n, k in [(1, 40, 576), (5, 13, 224), (8, 24, 1536), (3, 7, 32), (16, 9, 64)]:
        for dtype in (torch.float32, torch.bfloat16):
            _check(mod, dtype, m, n, k, seed=path * 100 + m)
    _check(mod, torch.float32, 4, 40, 576, seed=9, half=False)


@needs_kernel
def test_policy_uses_the_kernel_only_when_asked() -> None:
    from radixlm.models.linear.int4 import Int4GroupwiseLinear
    from radixlm.models.linear.policy import LinearPolicy, make_linear_method

    from radixlm.models.linear.int4 import int4_bf16_kernel_usable

    groups = _groups(40, 64, torch.Generator().manual_seed(4))  # 40 rows: not aten's 16s
    w = groups.dequantize().bfloat16()
    default = make_linear_method(w, groups, LinearPolicy("auto"))
    # The default: the int4_bf16 kernel (unquantized activations) where the CPU has it.
    if int4_bf16_kernel_usable():
        assert isinstance(default, Int4GroupwiseLinear) and default._bf16 is not None
    else:
        assert not isinstance(default, Int4GroupwiseLinear)
    on = make_linear_method(w, groups, LinearPolicy("auto", int4_int8_activations=True))
    assert isinstance(on, Int4GroupwiseLinear) and on._kernel is not None and on._bf16 is None
    # float32 runs: the groups_f32 kernel where it builds, x unquantized by default (a
    # dense float32 copy past its rows), its int8-activation calls (the same words) when
    # asked, then for every call (no dense copy).
    from radixlm.models.linear.groups_f32 import groups_f32_usable
    from radixlm.models.linear.policy import DEFAULT_GROUPS_F32_MAX_M

    if groups_f32_usable():
        f32 = make_linear_method(w.float(), groups, LinearPolicy("auto"))
        assert isinstance(f32, Int4GroupwiseLinear) and f32._f32 is not None
        on32 = make_linear_method(w.float(), groups,
                                  LinearPolicy("auto", int4_int8_activations=True))
        assert isinstance(on32, Int4GroupwiseLinear) and on32._f32 is not None
        assert not f32.int8_activations and on32.int8_activations
        assert f32.max_m == DEFAULT_GROUPS_F32_MAX_M and f32.fallback is not None
        assert on32._kernel is None and on32.fallback is None and on32.max_m == sys.maxsize
        for rows in (3, DEFAULT_GROUPS_F32_MAX_M + 1):
            x = torch.randn(rows, 64)
            torch.testing.assert_close(on32(x), x @ w.float().t(), rtol=0.02, atol=0.02)
