"""int8 and 5-bit groups dequantized into AMX B tiles (cpu_kernels/bf16_tiles.cpp's
bf16_tiles_q8_* and bf16_tiles_q5_*), and Int8GroupwiseLinear's / Q5GroupwiseLinear's
calls past their kernels' rows (`tiles_max_m`; the policy's `int8_tiles_max_m`,
`q5_tiles_max_m`, the LM head's too).

The tiles hold bf16(q s) (int8, groups of 32 or 16) and bf16(d (q - 16)) (5-bit), each
weight rounded as the dense copy rounds it: the products equal bf16_tiles_matmul's on
the dense bf16 weight bit for bit, across the 32-row passes and the 256-row chunks,
partial blocks of 16 channels included. Runs where the CPU has AMX-BF16."""

from __future__ import annotations

import sys

import pytest
import torch

from radixlm.models.linear.bf16_tiles import TiledBf16Linear, bf16_tiles_kernel, pack_tiles
from radixlm.models.linear.int8_groups import Int8Groups, Int8GroupwiseLinear
from radixlm.models.linear.q5_bf16 import Q5GroupwiseLinear, q5_bf16_kernel_usable
from radixlm.models.linear.q5_bf16_blocks import pack_q5_blocks, q5_scales

kernel = bf16_tiles_kernel()
needs_kernel = pytest.mark.skipif(kernel is None, reason="the tiles need AMX-BF16")
needs_q5 = pytest.mark.skipif(kernel is None or not q5_bf16_kernel_usable(),
                              reason="5-bit tiles need AMX-BF16 (and the q5_bf16 kernel)")


def _int8(n: int, k: int, seed: int, group: int = 32) -> Int8Groups:
    """Q8_0-like groups (float16 scales, q in -127..127), or with groups of 16 Q6_K-like
    ones (q in -32..31, scales a float16 times a signed 8-bit scale)."""
    g = torch.Generator().manual_seed(seed)
    lim = 128 if group == 32 else 32
    q = torch.randint(-lim + (group == 32), lim, (n, k), generator=g, dtype=torch.int8)
    s = (torch.rand(n, k // group, generator=g) * 0.01 + 1e-4).half().float()
    if group == 16:
        s = s * torch.randint(-128, 128, s.shape, generator=g).float()
    return Int8Groups(q, s, group)


def _q5(n: int, k: int, seed: int) -> Int8Groups:
    """Q5_0 groups: q in -16..15, float16 scales."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-16, 16, (n, k), generator=g, dtype=torch.int8)
    d = (torch.rand(n, k // 32, generator=g) * 0.02 + 1e-3).half().float()
    return Int8Groups(q, d, 32)


def _q5_operands(groups: Int8Groups) -> tuple[torch.Tensor, torch.Tensor]:
    return pack_q5_blocks(groups.q.to(torch.int16) + 16), q5_scales(groups.s)


def _dense(groups: Int8Groups) -> torch.Tensor:
    return pack_tiles(groups.dequantize().to(torch.bfloat16))


@needs_kernel
@pytest.mark.parametrize("rows", [1, 9, 16, 17, 33, 300])
@pytest.mark.parametrize("n,k", [(40, 96), (64, 576), (100, 1536)])
@pytest.mark.parametrize("group", [32, 16])
def test_int8_equals_the_dense_tiles_bit_for_bit(rows: int, n: int, k: int, group: int) -> None:
    groups = _int8(n, k, seed=rows + n + k, group=group)
    dense = _dense(groups)
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, k, generator=g).bfloat16()
    bias = torch.randn(n, generator=g)
    for b in (None, bias):
        assert torch.equal(kernel.bf16_tiles_q8_matmul(x, groups.q, groups.s, group, b),
                           kernel.bf16_tiles_matmul(x, dense, n, b))


@needs_q5
@pytest.mark.parametrize("rows", [1, 9, 17, 33, 300])
@pytest.mark.parametrize("n,k", [(40, 96), (100, 640)])
def test_q5_equals_the_dense_tiles_bit_for_bit(rows: int, n: int, k: int) -> None:
    groups = _q5(n, k, seed=rows + n + k)
    q, d = _q5_operands(groups)
    dense = _dense(groups)
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, k, generator=g).bfloat16()
    bias = torch.randn(n, generator=g)
    for b in (None, bias):
        assert torch.equal(kernel.bf16_tiles_q5_matmul(x, q, d, n, b),
                           kernel.bf16_tiles_matmul(x, dense, n, b))


@needs_q5
@pytest.mark.parametrize("rows,k,h", [(1, 64, 16), (20, 640, 1024), (300, 96, 48)])
@pytest.mark.parametrize("gelu", [False, True])
def test_gated_equals_the_dense_gated(rows: int, k: int, h: int, gelu: bool) -> None:
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(k)).bfloat16()
    five = _q5(2 * h, k, seed=rows + h)
    assert torch.equal(kernel.bf16_tiles_q5_gated(x, *_q5_operands(five), h, gelu),
                       kernel.bf16_tiles_gated(x, _dense(five), h, gelu))
    for group in (32, 16):
        eight = _int8(2 * h, k, seed=rows + h, group=group)
        assert torch.equal(kernel.bf16_tiles_q8_gated(x, eight.q, eight.s, group, gelu),
                           kernel.bf16_tiles_gated(x, _dense(eight), h, gelu))


@needs_q5
def test_refuses_operands_off_the_layout() -> None:
    groups = _int8(32, 64, seed=1)
    x = torch.randn(2, 64).bfloat16()
    with pytest.raises(RuntimeError, match="int8"):
        kernel.bf16_tiles_q8_matmul(x, groups.q.to(torch.uint8), groups.s, 32)
    with pytest.raises(RuntimeError, match="16 or 32"):
        kernel.bf16_tiles_q8_matmul(x, groups.q, groups.s, 8)
    with pytest.raises(RuntimeError, match="float32"):
        kernel.bf16_tiles_q8_matmul(x, groups.q, groups.s[:, :1].contiguous(), 32)
    with pytest.raises(RuntimeError, match="bfloat16"):
        kernel.bf16_tiles_q8_matmul(x.float(), groups.q, groups.s, 32)
    q, d = _q5_operands(_q5(32, 64, seed=2))
    with pytest.raises(RuntimeError, match="float16"):
        kernel.bf16_tiles_q5_matmul(x, q, d.float(), 32)
    with pytest.raises(RuntimeError, match="uint8"):
        kernel.bf16_tiles_q5_matmul(x, q[:1], d, 32)


def _counting(fallback: TiledBf16Linear) -> tuple[list[int], object]:
    calls: list[int] = []
    real = fallback.forward
    fallback.forward = lambda x, bias=None: calls.append(x.shape[0]) or real(x, bias)
    return calls, real


@needs_q5
@pytest.mark.parametrize("fmt", ["int4", "int8", "q5"])
def test_methods_take_the_tiles_between_their_kernel_and_the_fallback(fmt: str) -> None:
    """Rows past max_m up to tiles_max_m: the tiles (the fallback's result, bit for bit,
    float32 x included, without calling it); further rows: the fallback. The three
    methods share this routing (SmallBatchQuantized)."""
    from radixlm.models.linear.int4 import Int4GroupwiseLinear
    from tests.unit.test_int4_tiles import _groups as int4_groups

    groups = {"int4": int4_groups(64, 96, seed=5), "int8": _int8(64, 96, seed=5),
              "q5": _q5(64, 96, seed=5)}[fmt]
    fallback = TiledBf16Linear(groups.dequantize().to(torch.bfloat16))
    calls, real = _counting(fallback)

    def method_of(**kw):
        if fmt == "int4":
            return Int4GroupwiseLinear(groups, fallback, 8, use_bf16=True, **kw)
        return (Int8GroupwiseLinear if fmt == "int8" else Q5GroupwiseLinear)(
            groups, fallback, 8, **kw)

    method = method_of(tiles_max_m=32)
    assert method.tiles_max_m == 32
    for rows in (9, 32):
        x = torch.randn(rows, 96).bfloat16()
        assert torch.equal(method(x), real(x))
        assert torch.equal(method(x.float()), real(x.float()))
    assert calls == []
    assert method.bytes_read(32) == method.kernel_bytes() < fallback.bytes_read(32)
    method(torch.randn(33, 96).bfloat16())
    assert calls == [33]
    x = torch.randn(20, 96).bfloat16()
    assert torch.equal(method.gated_act_mul(x, True), fallback.gated_act_mul(x, True))
    assert method.gated_act_mul(torch.randn(4, 96).bfloat16(), False) is None  # kernel rows
    assert method_of().tiles_max_m == 8  # off by default in the class


@needs_q5
def test_policy_keeps_no_dense_copy_with_amx_tiles() -> None:
    """Default: int8-group and 5-bit layers and a large int8 head keep no dense copy (every
    call past their kernels' rows on the tiles, equal to the dense copy); a row limit keeps
    the copy past it; with the limit at 0 or without amx_tiles, the fallback as before."""
    from radixlm.models.linear import LinearPolicy
    from radixlm.models.linear.policy import (INT8_HEAD_MIN_ROWS, make_head_method,
                                              make_linear_method)

    x = torch.randn(300, 96).bfloat16()
    for groups, cls, field in ((_int8(64, 96, seed=7, group=16), Int8GroupwiseLinear,
                                "int8_tiles_max_m"),
                               (_q5(64, 96, seed=8), Q5GroupwiseLinear, "q5_tiles_max_m")):
        weight = groups.dequantize().to(torch.bfloat16)
        dense = TiledBf16Linear(weight)
        method = make_linear_method(weight, None, LinearPolicy("auto"), int8=groups)
        assert isinstance(method, cls) and method.fallback is None
        assert method.tiles_max_m == sys.maxsize
        assert torch.equal(method(x), dense(x))
        assert torch.equal(method.gated_act_mul(x, False), dense.gated_act_mul(x, False))
        assert method.bytes_read(300) == method.kernel_bytes()
        limited = make_linear_method(weight, None, LinearPolicy("auto", **{field: 64}), int8=groups)
        assert limited.tiles_max_m == 64 and isinstance(limited.fallback, TiledBf16Linear)
        for policy in (LinearPolicy("auto", amx_tiles=False), LinearPolicy("auto", **{field: 0})):
            method = make_linear_method(weight, None, policy, int8=groups)
            assert method.tiles_max_m == method.max_m and method.fallback is not None
    head = _int8(INT8_HEAD_MIN_ROWS, 64, seed=9)
    method = make_head_method(head.dequantize().to(torch.bfloat16), head, LinearPolicy("auto"))
    assert isinstance(method, Int8GroupwiseLinear) and method.fallback is None
    xh = torch.randn(12, 64).bfloat16()
    assert torch.equal(method(xh), kernel.bf16_tiles_matmul(xh, _dense(head), head.shape[0]))


@needs_q5
def test_trace_under_torch_compile_as_the_custom_ops() -> None:
    x = torch.randn(20, 64).bfloat16()
    for method in (Int8GroupwiseLinear(_int8(48, 64, seed=2), None, 8, tiles_max_m=None),
                   Q5GroupwiseLinear(_q5(48, 64, seed=3), None, 8, tiles_max_m=None)):
        torch._dynamo.reset()
        compiled = torch.compile(method, backend="eager", fullgraph=True)
        assert torch.equal(compiled(x), method(x))


def test_q5_without_fallback_needs_the_tiles() -> None:
    if not q5_bf16_kernel_usable():
        pytest.skip("the q5_bf16 kernel needs AVX512-BF16")
    with pytest.raises(ValueError, match="no dense fallback"):
        Q5GroupwiseLinear(_q5(32, 64, seed=4), None, 8, tiles_max_m=0)
