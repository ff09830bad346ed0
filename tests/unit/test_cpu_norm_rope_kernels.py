"""The eager CPU RMSNorm (alone and with the residual add), RoPE and SiLU * up kernels
(cpu_kernels/norm_rope.cpp) give the torch code's results (rms_norm.py, rope.py,
mlp.py's GatedMLP; the model logit tests run whole models through them): exactly up to float32 summation order, and to the same bf16
rounding points."""

from __future__ import annotations

import pytest
import torch

import radixlm.models.rms_norm as rms_norm_mod
import radixlm.models.rope as rope_mod
from radixlm.cpu_kernels.build import load_kernel
from radixlm.models.rms_norm import RMSNorm
from radixlm.models.rope import apply_rotary

pytestmark = pytest.mark.skipif(load_kernel("norm_rope") is None,
                                reason="the C++ CPU kernels did not build (needs g++ and ninja)")


def _torch_path(monkeypatch, module) -> None:
    monkeypatch.setattr(module, "eager_kernels", lambda x: None)


def _norm(dtype: torch.dtype, g: torch.Generator) -> RMSNorm:
    """SmolLM2's width, weights around 1."""
    norm = RMSNorm(576, 1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(576, generator=g))
    return norm


def _assert_same_rounding(out: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
    if out.dtype is torch.bfloat16:  # the same rounding points: nearly every element equal
        assert (out != ref).float().mean() < 0.01


@pytest.mark.parametrize("dtype,ulps", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("rows", [1, 3, 200])
def test_rms_norm_matches_torch(monkeypatch, dtype, ulps, rows):
    g = torch.Generator().manual_seed(rows)
    norm = _norm(dtype, g)
    wide = (3 * torch.randn(rows, 700, generator=g)).to(dtype)
    x = wide[:, :576]  # strided rows, as a slice of a wider activation
    with torch.no_grad():
        out = norm(x)
        _torch_path(monkeypatch, rms_norm_mod)
        ref = norm(x)
    assert out.dtype == dtype and out.shape == ref.shape
    _assert_same_rounding(out, ref, ulps)


@pytest.mark.parametrize("dtype,ulps", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("rows", [1, 5, 300])
def test_add_rms_norm_matches_torch(monkeypatch, dtype, ulps, rows):
    g = torch.Generator().manual_seed(rows)
    norm = _norm(dtype, g)
    residual = (3 * torch.randn(rows, 576, generator=g)).to(dtype)
    delta = torch.randn(rows, 900, generator=g).to(dtype)[:, 100:676]  # strided rows
    with torch.no_grad():
        summed, normed = norm.add_forward(residual, delta)
        _torch_path(monkeypatch, rms_norm_mod)
        ref_sum, ref_normed = norm.add_forward(residual, delta)
    torch.testing.assert_close(summed, ref_sum, rtol=0, atol=0)  # one rounded add: exact
    assert not torch.equal(summed, residual)  # the add happened (the inputs are untouched)
    _assert_same_rounding(normed, ref_normed, ulps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 4, 64])
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_act_mul_matches_torch(dtype, rows, act):
    """kernels.silu_mul / gelu_tanh_mul([gate | up]) == F.silu(gate) * up and
    F.gelu(gate, approximate="tanh") * up, GatedMLP's torch code (gates from -40 to 40:
    both tails of the sigmoid, rows strided)."""
    g = torch.Generator().manual_seed(rows)
    inter = 1536
    wide = torch.randn(rows, 2 * inter + 64, generator=g)
    wide[:, :inter] *= 8
    wide[0, :5] = torch.tensor([-40.0, -20.0, 0.0, 20.0, 40.0])
    gate_up = wide.to(dtype)[:, :2 * inter]
    out = getattr(load_kernel("norm_rope"), f"{act}_mul")(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    if act == "silu":
        ref = torch.nn.functional.silu(gate) * up
    else:
        ref = torch.nn.functional.gelu(gate, approximate="tanh") * up
    _assert_same_rounding(out, ref, 1e-6 if dtype is torch.float32 else 1e-2)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 0.0)])
def test_rotary_matches_torch(monkeypatch, dtype, tol):
    g = torch.Generator().manual_seed(0)
    t, heads, d = 7, 12, 64
    qkv = torch.randn(t, heads * d + 3 * d, generator=g).to(dtype)
    x = qkv[:, :heads * d]  # q|k columns of the fused projection output
    angles = torch.randn(t, d // 2, generator=g)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    out = apply_rotary(x, cos, sin, d)
    _torch_path(monkeypatch, rope_mod)
    ref = apply_rotary(x, cos, sin, d)
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
