"""Gemma's (1 + w) RMSNorm on the C++ kernel (cpu_kernels/norm_rope.cpp, alone, per head,
and fused as a sandwich block's output norm + residual add + next input norm) gives the
torch code's results (rms_norm.py's GemmaRMSNorm): float32 within a few float32 ulps (the
sum of squares is added in another order), bf16 within one bf16 ulp at the same rounding
points (almost every element bit-equal: only a float32 scale an ulp apart can flip a
bf16 rounding)."""

from __future__ import annotations

import pytest
import torch

import radixlm.models.rms_norm as rms_norm_mod
from radixlm.cpu_kernels.build import load_kernel
from radixlm.models.rms_norm import GemmaRMSNorm

pytestmark = pytest.mark.skipif(load_kernel("norm_rope") is None,
                                reason="the C++ CPU kernels did not build (needs g++ and ninja)")


def _norm(n: int, dtype: torch.dtype, g: torch.Generator) -> GemmaRMSNorm:
    norm = GemmaRMSNorm(n, 1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(0.5 * torch.randn(n, generator=g))  # zero-centred, as HF stores w
    return norm


def _torch_ref(monkeypatch, fn):
    with monkeypatch.context() as m:
        m.setattr(rms_norm_mod, "eager_kernels", lambda x: None)
        return fn()


def _assert_within_one_ulp(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape
    if out.dtype is torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
        return
    # bf16: one ulp of each reference element (8 mantissa bits), and nearly all equal.
    ulp = ref.float().abs().clamp_min(1e-30) * 2.0 ** -7
    assert ((out.float() - ref.float()).abs() <= ulp).all()
    assert (out != ref).float().mean() < 0.01


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [640, 256, 67])
@pytest.mark.parametrize("rows", [1, 2, 7, 33])
def test_gemma_rms_norm_matches_torch(monkeypatch, dtype, n, rows):
    g = torch.Generator().manual_seed(rows * 1000 + n)
    norm = _norm(n, dtype, g)
    wide = (3 * torch.randn(rows, n + 37, generator=g)).to(dtype)
    x = wide[:, 5:5 + n]  # strided rows
    with torch.no_grad():
        out = norm.forward(x)
        ref = _torch_ref(monkeypatch, lambda: norm.forward(x))
    _assert_within_one_ulp(out, ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 33])
def test_gemma_head_norm_matches_torch(monkeypatch, dtype, rows):
    """q/k norms: [T, heads, d] views of a wider qkv row, each head normalized alone."""
    g = torch.Generator().manual_seed(rows)
    d, heads = 256, 4
    norm = _norm(d, dtype, g)
    qkv = (2 * torch.randn(rows, heads * d + 2 * d, generator=g)).to(dtype)
    q = qkv[:, :heads * d].reshape(rows, heads, d)
    with torch.no_grad():
        out = norm.forward(q)
        ref = _torch_ref(monkeypatch, lambda: norm.forward(q))
    _assert_within_one_ulp(out, ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [640, 67])
@pytest.mark.parametrize("rows", [1, 5, 33])
@pytest.mark.parametrize("with_next", [True, False])
def test_gemma_norm_add_norm_matches_torch(monkeypatch, dtype, n, rows, with_next):
    g = torch.Generator().manual_seed(rows + n)
    post, nxt = _norm(n, dtype, g), _norm(n, dtype, g)
    residual = (3 * torch.randn(rows, n, generator=g)).to(dtype)
    delta = (20 * torch.randn(rows, n + 50, generator=g)).to(dtype)[:, 50:]  # strided rows
    next_norm = nxt if with_next else None
    with torch.no_grad():
        summed, normed = post.norm_add_forward(residual, delta, next_norm)
        ref_sum, ref_normed = _torch_ref(
            monkeypatch, lambda: post.norm_add_forward(residual, delta, next_norm))
    _assert_within_one_ulp(summed, ref_sum)
    assert not torch.equal(summed, residual)
    if with_next:
        _assert_within_one_ulp(normed, ref_normed)
    else:
        assert normed is None and ref_normed is None


def test_one_plus_w_follows_weight_changes():
    """The float32 1 + w copy is rebuilt after an in-place write to `weight` and after a
    loader's `.data` write announced by process_weights_after_loading."""
    norm = GemmaRMSNorm(64, 1e-6)
    x = torch.randn(2, 64)
    with torch.no_grad():
        before = norm.forward(x)
        norm.weight.add_(1.0)  # bumps the version
        torch.testing.assert_close(norm.forward(x), 2 * before)
        norm.weight.data.copy_(torch.full((64,), 2.0))  # no version bump
        norm.process_weights_after_loading()
        torch.testing.assert_close(norm.forward(x), 3 * before)
