"""The bf16_tiles C++ kernel (cpu_kernels/bf16_tiles.cpp) and TiledBf16Linear
(models/linear/bf16_tiles.py): x @ W.T for a bf16 weight on AMX tiles.

Against a float64 reference of the same bf16 values: float32 summation only (each output
one float32 sum of exact bf16 products), plus the bf16 rounding of the output. A row's
result does not depend on the call's row count (decode batches of any size, prefill
chunks across the kernel's 32-row passes and 256-row chunks). Runs where the CPU has
AMX-BF16 (skipped elsewhere: PrepackedLinear stays the dense method there)."""

from __future__ import annotations

import pytest
import torch

from radixlm.models.linear.bf16_tiles import (TiledBf16Linear, bf16_tiles_fit, bf16_tiles_kernel,
                                              pack_tiles, unpack_tiles)

kernel = bf16_tiles_kernel()
needs_kernel = pytest.mark.skipif(kernel is None, reason="bf16_tiles needs AMX-BF16 tiles")


@pytest.mark.parametrize("n,k", [(16, 32), (40, 96), (33, 224), (7, 576)])
def test_pack_round_trip(n: int, k: int) -> None:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n + k)).bfloat16()
    t = pack_tiles(w)
    assert t.shape == (-(-n // 16), k // 32, 16, 32) and t.dtype == torch.bfloat16
    assert torch.equal(unpack_tiles(t, n), w)
    padded = unpack_tiles(t, t.shape[0] * 16)
    assert not padded[n:].any()  # the last block's missing channels are zeros


def test_pack_layout() -> None:
    """Tile (b, g), row r, lane 2 j + e = W[16 b + j, 32 g + 2 r + e]."""
    w = torch.zeros(32, 64, dtype=torch.bfloat16)
    w[16 + 5, 32 + 2 * 7 + 1] = 3.0
    t = pack_tiles(w)
    assert t[1, 1, 7, 2 * 5 + 1] == 3.0 and int((t != 0).sum()) == 1


def _check(m: int, n: int, k: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g).bfloat16()
    x = (torch.randn(m, k, generator=g) * 2).bfloat16()
    y = kernel.bf16_tiles_matmul(x, pack_tiles(w), n)
    assert y.shape == (m, n) and y.dtype == torch.bfloat16
    ref = x.double() @ w.double().T
    scale = x.double().abs() @ w.double().abs().T
    err = (y.double() - ref).abs()
    assert (err <= 1e-6 * scale + 2.0 ** -8 * ref.abs() + 1e-30).all()


@needs_kernel
@pytest.mark.parametrize("m", [1, 2, 7, 15, 16, 17, 31, 32, 33, 64, 100, 257, 300])
@pytest.mark.parametrize("n,k", [(40, 96), (33, 224), (64, 576), (100, 1536)])
def test_matmul_against_reference(m: int, n: int, k: int) -> None:
    _check(m, n, k, seed=m * 1000 + n + k)


@needs_kernel
def test_rows_equal_single_row_calls_bit_for_bit() -> None:
    """Each row of a call of any row count gets what a one-row call gives it."""
    g = torch.Generator().manual_seed(5)
    n, k = 72, 256
    w = pack_tiles(torch.randn(n, k, generator=g).bfloat16())
    # A wide exponent range, so that float32 sums round and their order would show.
    scale = torch.exp2(torch.randint(-12, 13, (300, k), generator=g).float())
    x = (torch.randn(300, k, generator=g) * scale).bfloat16()
    one = torch.cat([kernel.bf16_tiles_matmul(x[i:i + 1].contiguous(), w, n)
                     for i in range(300)])
    for m in (2, 9, 16, 17, 32, 33, 70, 256, 257, 300):
        assert torch.equal(kernel.bf16_tiles_matmul(x[:m].contiguous(), w, n), one[:m]), m


@needs_kernel
def test_refuses_what_it_cannot_compute() -> None:
    w = pack_tiles(torch.randn(16, 64).bfloat16())
    with pytest.raises(RuntimeError, match="bfloat16 contiguous"):
        kernel.bf16_tiles_matmul(torch.randn(2, 64), w, 16)
    with pytest.raises(RuntimeError, match="w \\["):
        kernel.bf16_tiles_matmul(torch.randn(2, 64).bfloat16(), w, 40)
    assert kernel.bf16_tiles_matmul(torch.randn(0, 64).bfloat16(), w, 16).shape == (0, 16)


@needs_kernel
def test_bias_is_added_before_the_one_rounding() -> None:
    """y = bf16(x . w + b) in float32: what oneDNN's fused bias gives (a bias added to the
    rounded bf16 output would round twice: qwen2's q|k|v biases moved logits 4x)."""
    g = torch.Generator().manual_seed(9)
    w = torch.randn(48, 64, generator=g).bfloat16()
    b = (torch.randn(48, generator=g) * 3).bfloat16()
    x = torch.randn(37, 64, generator=g).bfloat16()
    y = kernel.bf16_tiles_matmul(x, pack_tiles(w), 48, b)
    plain = kernel.bf16_tiles_matmul(x, pack_tiles(w), 48)
    ref = x.double() @ w.double().T + b.double()
    assert ((y.double() - ref).abs() <= 1e-6 * (x.double().abs() @ w.double().abs().T)
            + 2.0 ** -8 * ref.abs() + 1e-30).all()
    assert not torch.equal(y, (plain + b))  # (the double rounding does differ here)
    with pytest.raises(RuntimeError, match="bias"):
        kernel.bf16_tiles_matmul(x, pack_tiles(w), 48, torch.zeros(47))


@needs_kernel
def test_linear_method() -> None:
    """Bias, leading dimensions, float32 and strided x; the weight given back exactly."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(50, 96, generator=g).bfloat16()
    bias = torch.randn(50, generator=g).bfloat16()
    lin = TiledBf16Linear(w)
    assert torch.equal(lin.dequantized_weight(), w)
    assert lin.own_bytes() == 64 * 96 * 2 and lin.format == "dense bfloat16 (AMX tiles)"
    x = torch.randn(2, 3, 96, generator=g).bfloat16()
    y = lin(x, bias)
    assert y.shape == (2, 3, 50)
    ref = (x.reshape(-1, 96).double() @ w.double().T).reshape(2, 3, 50) + bias.double()
    assert ((y.double() - ref).abs() <= 2.0 ** -7 * ref.abs() + 1e-2).all()
    xt = torch.randn(96, 4, generator=g).bfloat16().t()  # not contiguous
    assert torch.equal(lin(xt), lin(xt.contiguous()))
    xf = torch.randn(4, 96, generator=g)
    yf = lin(xf)
    assert yf.dtype == torch.float32 and torch.equal(yf, lin(xf.bfloat16()).float())


@needs_kernel
def test_traces_under_torch_compile_as_the_custom_op() -> None:
    lin = TiledBf16Linear(torch.randn(48, 64).bfloat16())
    x = torch.randn(5, 64).bfloat16()
    torch._dynamo.reset()
    compiled = torch.compile(lin, backend="eager", fullgraph=True)
    assert torch.equal(compiled(x), lin(x))


def test_policy_picks_tiles_only_where_they_fit() -> None:
    from radixlm.models.linear import DenseLinear, LinearPolicy, PrepackedLinear
    from radixlm.models.linear.method import onednn_prepack_available
    from radixlm.models.linear.policy import make_linear_method

    w = torch.randn(32, 64).bfloat16()
    # Without the tiles: oneDNN's prepacked bf16 GEMM where it has one (AVX-512 or AMX),
    # else F.linear (AVX2 alone).
    other = (PrepackedLinear if onednn_prepack_available(torch.bfloat16, torch.device("cpu"))
             else DenseLinear)
    method = make_linear_method(w, None, LinearPolicy())
    assert type(method) is (TiledBf16Linear if kernel is not None else other)
    assert type(make_linear_method(w, None, LinearPolicy(amx_tiles=False))) is other
    assert not bf16_tiles_fit(torch.randn(32, 64))              # float32 run: oneDNN
    assert not bf16_tiles_fit(torch.randn(32, 48).bfloat16())   # K not whole groups


@needs_kernel
@pytest.mark.parametrize("m,k,h", [(1, 64, 16), (9, 576, 1536), (40, 96, 48), (300, 640, 2048)])
@pytest.mark.parametrize("gelu", [False, True])
def test_gated_epilogue_equals_the_gemm_then_act_mul(m: int, k: int, h: int, gelu: bool) -> None:
    """bf16_tiles_gated = the [gate | up] GEMM, then norm_rope's act(gate) * up, bit for
    bit (the same roundings: activations.h), across the 32-row passes and 256-row chunks."""
    from radixlm.cpu_kernels.build import load_kernel

    g = torch.Generator().manual_seed(m + k + h)
    w = (0.1 * torch.randn(2 * h, k, generator=g)).bfloat16()
    x = torch.randn(m, k, generator=g).bfloat16()
    tiles = pack_tiles(w)
    gate_up = kernel.bf16_tiles_matmul(x, tiles, 2 * h, None)
    norm_rope = load_kernel("norm_rope")
    act_mul = norm_rope.gelu_tanh_mul if gelu else norm_rope.silu_mul
    assert torch.equal(kernel.bf16_tiles_gated(x, tiles, h, gelu), act_mul(gate_up))
    assert kernel.bf16_tiles_gated(x[:0], tiles, h, gelu).shape == (0, h)


@needs_kernel
def test_gated_refuses_halves_off_the_block_grid() -> None:
    w = torch.randn(2 * 24, 64).bfloat16()  # halves of 24 channels: not whole blocks
    with pytest.raises(RuntimeError, match="multiple of 16"):
        kernel.bf16_tiles_gated(torch.randn(2, 64).bfloat16(), pack_tiles(w), 24, False)
    lin = TiledBf16Linear(w)
    assert lin.gated_act_mul(torch.randn(2, 64).bfloat16(), False) is None
    lin = TiledBf16Linear(torch.randn(64, 64).bfloat16())
    assert lin.gated_act_mul(torch.randn(2, 64), False) is None  # float32 x: forward path
    assert lin.gated_act_mul(torch.randn(2, 64).bfloat16(), False).shape == (2, 32)


@needs_kernel
def test_gated_mlp_takes_the_fused_path_with_the_same_output() -> None:
    """GatedMLP over a tiles gate_up: the fused call, equal to the unfused MLP; a quantized
    method passes its dense fallback's fused path through only for its large calls."""
    from types import SimpleNamespace

    from radixlm.models.linear.method import SmallBatchQuantized
    from radixlm.models.mlp import GatedMLP
    from radixlm.models.parallel_context import SINGLE

    g = torch.Generator().manual_seed(3)
    cfg = SimpleNamespace(hidden_size=64, intermediate_size=96, mlp_bias=False,
                          hidden_act="silu")
    mlp = GatedMLP(cfg, SINGLE)
    for layer in (mlp.gate_up_proj, mlp.down_proj):
        layer.weight.data = (0.1 * torch.randn(layer.weight.shape, generator=g)).bfloat16()
    up = TiledBf16Linear(mlp.gate_up_proj.weight.data)
    mlp.gate_up_proj.method, mlp.gate_up_proj.method_forward = up, up.forward
    x = torch.randn(20, 64, generator=g).bfloat16()
    calls = []
    real = up.gated_act_mul
    # What finalize_linear sets for a bias-free layer: the method's fused path.
    mlp.gate_up_proj.method_gated = lambda x, gelu: calls.append(x.shape[0]) or real(x, gelu)
    with torch.inference_mode():
        fused = mlp.forward(x)
        mlp.gate_up_proj.method_gated = None  # a method without one
        plain = mlp.forward(x)
    assert calls == [20] and torch.equal(fused, plain)

    class _Small(SmallBatchQuantized):
        def small(self, x):
            return self.fallback.forward(x)

    q = _Small(up, max_m=8)
    assert q.gated_act_mul(x[:8], False) is None  # its kernel's rows: no fused path
    assert torch.equal(q.gated_act_mul(x, False), real(x, False))
