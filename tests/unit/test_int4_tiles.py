"""4-bit groups dequantized into AMX B tiles (cpu_kernels/bf16_tiles.cpp's
bf16_tiles_q4_matmul / bf16_tiles_q4_gated) and Int4GroupwiseLinear's calls past its
int4 kernel's rows (models/linear/int4.py, `tiles_max_m`).

The tiles hold bf16(d q + m), each weight rounded as Int4Groups.dequantize then a cast
round it: the products equal bf16_tiles_matmul's on the dense bf16 weight bit for bit,
with the one-FMA dequantization (c = m - 128 d exact) and the two-step one, across the
32-row passes and the 1024-row chunks. Runs where the CPU has AMX-BF16."""

from __future__ import annotations

import pytest
import torch

from radixlm.models.linear.bf16_tiles import bf16_tiles_kernel, pack_tiles
from radixlm.models.linear.int4 import Int4GroupwiseLinear, int4_bf16_kernel, offset_exact
from radixlm.models.linear.int4_bf16_blocks import block_scales, pack_bf16_blocks
from radixlm.models.linear.int4_groups import Int4Groups

kernel = bf16_tiles_kernel()
needs_kernel = pytest.mark.skipif(kernel is None or int4_bf16_kernel() is None,
                                  reason="4-bit tiles need AMX-BF16")


def _groups(n: int, k: int, seed: int, k_quant: bool = False) -> Int4Groups:
    """Random Q4_1-like groups (float16 d and m, the minimum m 8-12 steps d below zero, as
    a group's range centred near zero gives), or Q4_K-like (d and m products of a float16
    and a 6-bit scale: 17-bit d, m anywhere)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    d = (torch.rand(n, k // 32, generator=g) * 0.02 + 1e-3).half().float()
    m = (-(8 + 4 * torch.rand(n, k // 32, generator=g)) * d).half().float()
    if k_quant:
        d = d * torch.randint(1, 64, d.shape, generator=g).float()
        m = (-torch.rand(n, k // 32, generator=g) * 0.1).half().float()
        m = m * torch.randint(1, 64, m.shape, generator=g).float()
    return Int4Groups(q, d, m, 32)


def _operands(groups: Int4Groups) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    d, m = block_scales(groups.d, groups.m)
    return pack_bf16_blocks(groups.q), d, m


@needs_kernel
@pytest.mark.parametrize("rows", [1, 9, 16, 17, 32, 33, 64, 300, 1025])
@pytest.mark.parametrize("n,k", [(40, 96), (64, 576), (100, 1536)])
@pytest.mark.parametrize("exact_c", [True, False])
def test_equals_the_dense_tiles_bit_for_bit(rows: int, n: int, k: int, exact_c: bool) -> None:
    groups = _groups(n, k, seed=rows + n + k, k_quant=not exact_c)
    if exact_c:  # (the two-step dequantization is exact either way)
        assert offset_exact(*block_scales(groups.d, groups.m))
    q, d, m = _operands(groups)
    dense = pack_tiles(groups.dequantize().to(torch.bfloat16))
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, k, generator=g).bfloat16()
    bias = torch.randn(n, generator=g)
    for b in (None, bias):
        assert torch.equal(kernel.bf16_tiles_q4_matmul(x, q, d, m, n, b, exact_c),
                           kernel.bf16_tiles_matmul(x, dense, n, b))


@needs_kernel
@pytest.mark.parametrize("rows,k,h", [(1, 64, 16), (20, 576, 1536), (300, 96, 48)])
@pytest.mark.parametrize("gelu", [False, True])
def test_gated_equals_the_dense_gated(rows: int, k: int, h: int, gelu: bool) -> None:
    groups = _groups(2 * h, k, seed=rows + k + h)
    q, d, m = _operands(groups)
    dense = pack_tiles(groups.dequantize().to(torch.bfloat16))
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(k)).bfloat16()
    assert torch.equal(kernel.bf16_tiles_q4_gated(x, q, d, m, h, gelu, True),
                       kernel.bf16_tiles_gated(x, dense, h, gelu))


@needs_kernel
def test_refuses_operands_off_the_layout() -> None:
    q, d, m = _operands(_groups(32, 64, seed=1))
    x = torch.randn(2, 64).bfloat16()
    with pytest.raises(RuntimeError, match="uint8"):
        kernel.bf16_tiles_q4_matmul(x, q[:1], d, m, 32)
    with pytest.raises(RuntimeError, match="float32"):
        kernel.bf16_tiles_q4_matmul(x, q, d.double(), m, 32)
    with pytest.raises(RuntimeError, match="bfloat16"):
        kernel.bf16_tiles_q4_matmul(x.float(), q, d, m, 32)


def test_offset_exact_finds_an_inexact_group() -> None:
    d = torch.full((1, 2, 16), 2.0 ** -7)
    m = torch.full((1, 2, 16), -0.05).half().float()
    assert offset_exact(d, m)  # float16 operands near each other: m - 128 d fits float32
    m[0, 1, 3] = -(1 + 2.0 ** -23)  # 24 significant bits; minus 1 carries into a 25th
    assert not offset_exact(d, m)
    assert offset_exact(torch.zeros(1, 1, 16), torch.full((1, 1, 16), 0.3))  # padding d


# Int4GroupwiseLinear's routing between its kernel, the tiles and the fallback:
# test_int8_q5_tiles.py::test_methods_take_the_tiles_between_their_kernel_and_the_fallback.


@needs_kernel
def test_policy_keeps_no_dense_copy_with_amx_tiles() -> None:
    """Default: every call past the kernel's rows on the tiles, no fallback (equal to the
    dense copy at prefill sizes, gated too); a row limit keeps the dense copy past it;
    without amx_tiles, or with the limit at 0, the dense fallback as before."""
    import sys

    from radixlm.models.linear import LinearPolicy
    from radixlm.models.linear.bf16_tiles import TiledBf16Linear
    from radixlm.models.linear.policy import make_linear_method

    groups = _groups(64, 96, seed=7)
    weight = groups.dequantize().to(torch.bfloat16)
    dense = TiledBf16Linear(weight)
    method = make_linear_method(weight, groups, LinearPolicy("auto"))
    assert isinstance(method, Int4GroupwiseLinear) and method.fallback is None
    assert method.tiles_max_m == sys.maxsize
    x = torch.randn(300, 96).bfloat16()
    assert torch.equal(method(x), dense(x))
    assert torch.equal(method.gated_act_mul(x, True), dense.gated_act_mul(x, True))
    assert method.bytes_read(300) == method.kernel_bytes()
    limited = make_linear_method(weight, groups, LinearPolicy("auto", int4_tiles_max_m=64))
    assert limited.tiles_max_m == 64 and isinstance(limited.fallback, TiledBf16Linear)
    for policy in (LinearPolicy("auto", amx_tiles=False), LinearPolicy("auto", int4_tiles_max_m=0)):
        method = make_linear_method(weight, groups, policy)
        assert method.tiles_max_m == method.max_m and method.fallback is not None


@needs_kernel
def test_traces_under_torch_compile_as_the_custom_op() -> None:
    method = Int4GroupwiseLinear(_groups(48, 64, seed=2), None, 8, use_bf16=True,
                                 tiles_max_m=None)
    x = torch.randn(20, 64).bfloat16()
    torch._dynamo.reset()
    compiled = torch.compile(method, backend="eager", fullgraph=True)
    assert torch.equal(compiled(x), method(x))


def test_no_fallback_needs_the_tiles() -> None:
    with pytest.raises(RuntimeError, match="no dense fallback"):
        Int4GroupwiseLinear(_groups(32, 64, seed=3), None, 8, use_bf16=False)
