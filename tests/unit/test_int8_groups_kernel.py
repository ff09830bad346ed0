"""The int8_groups kernel (activations quantized per group to int8 at run time, int32 dot
products): against a float64 reference of the dequantized weights times the quantized
activations (tight: only the float32 scaling and summation round), and against the
unquantized activations (the quantization's error, stated bound), for M = 1..8 (the
speculative verify's rows) and more, G = 16 and 32, odd group counts, N not a multiple of
16, float32 and bfloat16 inputs; the AVX2 and scalar paths built and checked the same way."""

from __future__ import annotations

import pytest
import torch

from radixlm.models.linear.int8_groups import Int8Groups, Int8GroupwiseLinear, int8_groups_kernel

kernel = int8_groups_kernel()
pytestmark = pytest.mark.skipif(kernel is None, reason="the int8_groups C++ kernel did not build")


def _case(n: int, k: int, m: int, group: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    s = torch.rand(n, k // group, generator=g) * 1e-2 + 1e-4
    x = torch.randn(m, k, generator=g) * torch.rand(1, k, generator=g) * 4
    return Int8Groups(q, s, group), x


def _w64(groups: Int8Groups) -> torch.Tensor:
    return groups.dequantize().double()  # exact products, so exact in float64


@pytest.mark.parametrize("group", [16, 32])
@pytest.mark.parametrize("n,k", [(37, 96), (53, 80), (40, 640), (17, 48)])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8, 9, 17])
def test_kernel_matches_float64_reference(n: int, k: int, m: int, group: int):
    if k % group:
        pytest.skip("k not a multiple of the group")
    groups, x = _case(n, k, m, group, seed=n * 1000 + k + m + group)
    a, d = kernel.quantize_activations(x, group)
    assert a.dtype == torch.int8 and int(a.abs().max()) <= 127
    xq = (a.double().view(m, -1, group) * d.double().unsqueeze(-1)).view(m, k)
    want = xq @ _w64(groups).t()
    got = kernel.int8_group_matmul(x, groups.q, groups.s, group)
    assert got.dtype == torch.float32 and got.shape == (m, n)
    scale = want.abs().max()
    assert (got.double() - want).abs().max() <= 1e-6 * scale  # float32 rounding only
    # The activation quantization: half a step (max|x| / 254 per group) per input.
    exact = x.double() @ _w64(groups).t()
    assert (got.double() - exact).abs().max() <= 2e-2 * scale
    # bfloat16 input: quantized from its (exact) float32 values.
    xb = x.bfloat16()
    got_b = kernel.int8_group_matmul(xb, groups.q, groups.s, group)
    torch.testing.assert_close(got_b, kernel.int8_group_matmul(xb.float(), groups.q, groups.s,
                                                               group), rtol=0, atol=0)


def test_quantization_rounds_to_nearest_with_max_abs_scale():
    x = torch.tensor([[1.0, -2.0, 0.5, 0.0] * 8 + [0.0] * 32])
    a, d = kernel.quantize_activations(x, 32)
    assert d[0, 0].item() == pytest.approx(2.0 / 127) and d[0, 1].item() == 0.0
    assert a[0, :4].tolist() == [64, -127, 32, 0] and int(a[0, 32:].abs().sum()) == 0


@pytest.mark.parametrize("m", [1, 4, 8])
def test_method_small_in_bf16(m: int):
    groups, x = _case(48, 256, m, 32, seed=m)
    method = Int8GroupwiseLinear(groups, None, max_m=8)
    y = method(x.bfloat16())
    assert y.dtype == torch.bfloat16
    want = x.bfloat16().double() @ _w64(groups).t()
    assert (y.double() - want).abs().max() <= 2e-2 * want.abs().max()


def test_rejects_other_group_sizes():
    groups, x = _case(16, 128, 1, 32, seed=0)
    with pytest.raises(RuntimeError):
        kernel.int8_group_matmul(x, groups.q, groups.s.view(16, -1)[:, :2].contiguous(), 64)


@pytest.mark.parametrize("path", [1, 0], ids=["avx2", "scalar"])
def test_avx2_and_scalar_builds_match_the_reference(path: int):
    """The machines without AVX512-VNNI compile these paths (built here with the AVX-512
    instructions switched off: tests/kernel_variants.py)."""
    from tests.kernel_variants import variant

    try:
        mod = variant("int8_groups", path)
    except Exception as e:  # noqa: BLE001 - no compiler here: nothing to check
        pytest.skip(f"could not build: {e}")
    assert mod.path() == path
    for group, (n, k) in [(16, (37, 80)), (32, (17, 96)), (32, (40, 640))]:
        for m in (1, 5, 8, 9):
            groups, x = _case(n, k, m, group, seed=m + k)
            got = mod.int8_group_matmul(x.bfloat16(), groups.q, groups.s, group)
            a, d = mod.quantize_activations(x.bfloat16().float(), group)
            xq = (a.double().view(m, -1, group) * d.double().unsqueeze(-1)).view(m, k)
            want = xq @ _w64(groups).t()
            assert (got.double() - want).abs().max() <= 1e-6 * want.abs().max()
