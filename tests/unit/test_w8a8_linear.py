"""W8A8Int8Linear (models/linear/w8a8.py): int8 x int8 through oneDNN matches a float32
reference of its own quantization (per-channel weights, per-token activations) exactly up
to float32 rounding, stays within int8 error of the unquantized product, and the policy
builds it for --quantization w8a8_int8. Skips where torch has no oneDNN int8 linear."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixlm.models.linear import (LinearPolicy, W8A8Int8Linear, make_linear_method,
                                   quantize_per_channel_int8, weight_bytes_by_format)
from radixlm.models.linear.w8a8 import ACT_ZERO_POINT, quantize_per_token_u8
from tests.conftest import requires_w8a8

CPU = torch.device("cpu")
pytestmark = requires_w8a8


def _reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The method's arithmetic in float32: (q_x @ q_w^T) * s_x * s_w + bias."""
    qw, sw = quantize_per_channel_int8(w)
    u, sx = quantize_per_token_u8(x)
    acc = (u.float() - ACT_ZERO_POINT) @ qw.float().t()  # exact: integers below 2^24
    y = acc * sw * sx
    return y + bias.float() if bias is not None else y


def test_quantize_per_token_u8() -> None:
    x = torch.tensor([[0.5, -1.0, 0.25, 0.0], [0.0, 0.0, 0.0, 0.0], [3.0, 1.5, -0.75, 2.9]])
    u, s = quantize_per_token_u8(x)
    assert u.dtype == torch.uint8 and s.shape == (3, 1)
    q = u.int() - ACT_ZERO_POINT
    assert q.abs().max() <= 127 and q[0].tolist() == [64, -127, 32, 0]  # 63.5 -> 64 (half up)
    assert q[1].tolist() == [0, 0, 0, 0]  # a zero row stays zero
    assert q[2, 0] == 127 and torch.allclose(q.float() * s, x, atol=float(s.max()) / 2)


@pytest.mark.parametrize("m,n,k,bias,dtype", [
    (1, 48, 64, False, torch.bfloat16), (1, 96, 128, True, torch.bfloat16),
    (7, 80, 96, True, torch.bfloat16), (33, 192, 576, False, torch.bfloat16),
    (64, 64, 256, True, torch.float32), (200, 32, 64, True, torch.bfloat16)])
def test_matches_reference(m: int, n: int, k: int, bias: bool, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(m * 1000 + n)
    w = torch.randn(n, k, generator=g) * 0.05
    x = (torch.randn(m, k, generator=g) * 2).to(dtype)
    b = (torch.randn(n, generator=g) * 0.1).to(dtype) if bias else None
    method = W8A8Int8Linear.from_dense(w)
    y = method(x, b)
    assert y.dtype == dtype and y.shape == (m, n)
    ref = _reference(x, w, b)
    ulp = 1e-2 if dtype == torch.bfloat16 else 1e-5  # the output's rounding
    assert torch.allclose(y.float(), ref, rtol=ulp, atol=ulp * ref.abs().max().item())
    # Within int8 error of the unquantized float32 product (~1% of its scale).
    full = F.linear(x.float(), w, b.float() if b is not None else None)
    assert ((y.float() - full).abs().max() / full.abs().max()).item() < 0.03


def test_leading_dims_zero_rows_and_weight() -> None:
    w = torch.randn(32, 64) * 0.1
    method = W8A8Int8Linear.from_dense(w)
    assert method(torch.zeros(0, 64).bfloat16()).shape == (0, 32)
    x = torch.randn(2, 3, 64).bfloat16()
    assert torch.equal(method(x), method(x.reshape(6, 64)).reshape(2, 3, 32))
    qw, sw = quantize_per_channel_int8(w)
    assert torch.allclose(method.dequantized_weight(), qw.float() * sw[:, None],
                          rtol=1e-6, atol=1e-7)


def test_policy_and_bytes() -> None:
    w = (torch.randn(64, 128) * 0.05).bfloat16()
    method = make_linear_method(w, None, LinearPolicy(quantization="w8a8_int8"))
    assert isinstance(method, W8A8Int8Linear)
    x = torch.randn(5, 128).bfloat16()
    assert ((method(x).float() - F.linear(x.float(), w.float())).abs().max()
            < 0.03 * F.linear(x.float(), w.float()).abs().max())
    # int8 values (one byte a weight, counted from the packed tensor), float32 scales,
    # one int64 zero point.
    assert weight_bytes_by_format(method) == {method.format: 64 * 128 + 64 * 4 + 8}


def test_tiny_llama_logits_and_greedy(tiny_llama_dir) -> None:
    """A tiny random Llama with --quantization w8a8_int8 vs the same model dense, both
    bfloat16: every prompt position's logits within 5% of the largest (int8 error through
    two layers and the head), and the same greedy tokens (its logits are well separated)."""
    from radixlm.models import load_model
    from tests.conftest_models import PoolHarness, rel_err

    dense, config = load_model(tiny_llama_dir, torch.bfloat16, "cpu",
                               linear_policy=LinearPolicy("none"))
    w8a8, _ = load_model(tiny_llama_dir, torch.bfloat16, "cpu",
                         linear_policy=LinearPolicy("w8a8_int8"))
    assert isinstance(w8a8.model.layers[0].self_attn.qkv_proj.method, W8A8Int8Linear)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, config.vocab_size, (n,), generator=g).tolist() for n in (9, 40)]
    hd, hw = PoolHarness(dense, config), PoolHarness(w8a8, config)
    ld = hd.extend([hd.new_request(), hd.new_request()], prompts, all_logits=True)
    lw = hw.extend([hw.new_request(), hw.new_request()], prompts, all_logits=True)
    assert lw.shape == ld.shape == (49, config.vocab_size)
    assert 0 < rel_err(lw, ld) < 0.05  # not the dense path, close to it
    assert (PoolHarness(w8a8, config).greedy(prompts, 8, config.eos_token_ids)
            == PoolHarness(dense, config).greedy(prompts, 8, config.eos_token_ids))
