"""Linear methods (models/linear/): each matches F.linear on its own dequantized weight,
GGUF Q4_0/Q4_1 groups are exactly the file's values, the policy picks per run, and the
int4 layers shard under TP=2 (gloo) like dense ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from radixlm.runtime.distributed import free_port
from radixlm.models.batch_invariant import BatchInvariantOps
from radixlm.models.gguf_int4 import int4_groups_from_blocks
from radixlm.models.linear import (DenseLinear, Int4Groups, Int4GroupwiseLinear,
                                   Int8WeightOnlyLinear, LinearMethod, LinearPolicy,
                                   PrepackedLinear, QuantizedCheckpointTensor,
                                   make_linear_method, quantize_per_channel_int8,
                                   weight_bytes_by_format)
from radixlm.models.linear.method import onednn_prepack_available
from radixlm.models.parallel_context import SINGLE, ParallelContext
from radixlm.models.parallel_layers import ColumnParallelLinear, RowParallelLinear, even_shard
from radixlm.models.linear.bf16_tiles import TiledBf16Linear, bf16_tiles_kernel
from radixlm.models.linear.groups_f32 import groups_f32_usable
from tests.tp_harness import child_setup, spawn_ranks

MS = (1, 7, 64)
CPU = torch.device("cpu")
# oneDNN has bf16 GEMMs only on AVX-512/AMX CPUs; elsewhere the dense method is F.linear.
BF16_PREPACK = onednn_prepack_available(torch.bfloat16, CPU)
# On AMX CPUs the bf16 dense method is radixlm's tile kernel (models/linear/bf16_tiles.py).
BF16_DENSE = (TiledBf16Linear if bf16_tiles_kernel() is not None
              else PrepackedLinear if BF16_PREPACK else DenseLinear)


def dense_bf16(w: torch.Tensor) -> LinearMethod:
    return BF16_DENSE(w.bfloat16())
# Relative tolerance per format against F.linear in float32 on the method's own weight:
# bf16 activations and outputs (a few bf16 ulps over K = 256 products).
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.float() - ref).abs().max() / ref.abs().max()).item()


def _q4(rows: int, cols: int, qtype: GGMLQuantizationType, seed: int = 0
        ) -> tuple[np.ndarray, np.ndarray]:
    """(raw GGUF blocks [rows, row_bytes], gguf's own dequantization [rows, cols])."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((rows, cols)) * 0.05 + rng.standard_normal((rows, 1)) * 0.01)
    blocks = quantize(w.astype(np.float32), qtype)
    return blocks, dequantize(blocks, qtype)


def _int4(rows: int, cols: int, seed: int = 0) -> Int4Groups:
    blocks, _ = _q4(rows, cols, GGMLQuantizationType.Q4_1, seed)
    return int4_groups_from_blocks(blocks, GGMLQuantizationType.Q4_1, rows, cols)


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1])
def test_gguf_int4_groups_are_exact(qtype) -> None:
    blocks, ref = _q4(48, 96, qtype)
    groups = int4_groups_from_blocks(blocks, qtype, 48, 96)
    assert groups.q.dtype == torch.uint8 and int(groups.q.max()) <= 15
    assert torch.equal(groups.dequantize(), torch.from_numpy(ref))  # bit for bit
    # ... and kept so by the int4 method (nibble packing, float32 d and m).
    method = Int4GroupwiseLinear(groups, DenseLinear(groups.dequantize()), max_m=4)
    assert torch.equal(method.dequantized_weight(), torch.from_numpy(ref))


def test_int4_groups_slicing() -> None:
    g = _int4(64, 128)
    full = g.dequantize()
    assert torch.equal(g.rows(16, 48).dequantize(), full[16:48])
    assert torch.equal(g.cols(32, 96).dequantize(), full[:, 32:96])
    assert g.cols(16, 80) is None  # cuts through a group of 32


@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dense_methods_match_f_linear(m: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(m)
    w = torch.randn(96, 256, generator=g).to(dtype)
    b = torch.randn(96, generator=g).to(dtype)
    x = torch.randn(m, 256, generator=g).to(dtype)
    ref = F.linear(x.float(), w.float(), b.float())
    methods = [DenseLinear(w), DenseLinear(w, BatchInvariantOps(row_tile=8).linear)]
    if onednn_prepack_available(dtype, CPU):
        methods.append(PrepackedLinear(w))
    if dtype == torch.bfloat16 and bf16_tiles_kernel() is not None:
        methods.append(TiledBf16Linear(w))
    for method in methods:
        y = method(x, b)
        assert y.dtype == dtype and y.shape == (m, 96)
        assert _rel(y, ref) < TOL[dtype], type(method).__name__
        assert torch.equal(method.dequantized_weight().float(), w.float())


@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("max_m", [4, 64])
def test_int4_method_matches_f_linear(m: int, max_m: int) -> None:
    """Both paths: the int4 kernel (m <= max_m) and the dense fallback."""
    groups = _int4(96, 256, seed=m)
    w = groups.dequantize()
    method = Int4GroupwiseLinear(groups, dense_bf16(w), max_m=max_m)
    x = torch.randn(m, 256, generator=torch.Generator().manual_seed(1)).bfloat16()
    b = torch.randn(96).bfloat16()
    y = method(x, b)
    assert y.dtype == torch.bfloat16
    assert _rel(y, F.linear(x.float(), w, b.float())) < TOL[torch.bfloat16]
    assert method.bytes_read(m) == (method.kernel_bytes() if m <= max_m
                                    else method.fallback.bytes_read(m))


@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("max_m", [4, 64])
def test_int8_method_matches_f_linear(m: int, max_m: int) -> None:
    w = torch.randn(96, 256, generator=torch.Generator().manual_seed(m))
    q, scales = quantize_per_channel_int8(w)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    deq = Int8WeightOnlyLinear.dequantize(q, scales)
    assert (deq - w).abs().max() <= scales.max() / 2 + 1e-6  # rounding to the nearest step
    method = Int8WeightOnlyLinear(q, scales, dense_bf16(deq), max_m=max_m)
    x = torch.randn(m, 256, generator=torch.Generator().manual_seed(2)).bfloat16()
    assert _rel(method(x), F.linear(x.float(), deq)) < TOL[torch.bfloat16]
    assert torch.equal(method.dequantized_weight(), deq)


def test_policy_picks_per_run() -> None:
    groups = _int4(64, 64)
    dense = groups.dequantize()
    auto, none = LinearPolicy(quantization="auto"), LinearPolicy(quantization="none")
    assert isinstance(make_linear_method(dense.bfloat16(), groups, auto), Int4GroupwiseLinear)
    # float32 runs: the groups_f32 kernel where it built (AVX2), the dense copy past its
    # rows; else, and with --quantization none, the same weights dense.
    f32 = make_linear_method(dense, groups, auto)
    if groups_f32_usable():
        assert isinstance(f32, Int4GroupwiseLinear) and isinstance(f32.fallback, PrepackedLinear)
    else:
        assert isinstance(f32, PrepackedLinear)
    assert isinstance(make_linear_method(dense, groups, none), PrepackedLinear)
    assert isinstance(make_linear_method(dense.bfloat16(), groups, none), BF16_DENSE)
    assert isinstance(make_linear_method(dense, None, LinearPolicy(prepack=False)), DenseLinear)
    assert isinstance(make_linear_method(dense.bfloat16(), None, LinearPolicy("int8")),
                      Int8WeightOnlyLinear)
    # Deterministic inference: the batch-invariant GEMM, never a quantized kernel.
    det = LinearPolicy(quantization="auto", gemm=BatchInvariantOps().linear)
    method = make_linear_method(dense.bfloat16(), groups, det)
    assert type(method) is DenseLinear and method.gemm == det.gemm
    assert not det.keeps_int4(torch.bfloat16, CPU)
    with pytest.raises(ValueError, match="--quantization"):
        LinearPolicy(quantization="fp4")


def test_layer_finalize_and_bytes_by_format() -> None:
    groups = _int4(64, 64)
    layer = ColumnParallelLinear(64, [even_shard(None, 64, SINGLE, "rows")], bias=False, ctx=SINGLE)
    layer.load("weight", QuantizedCheckpointTensor(groups.dequantize().bfloat16(), groups), None)
    layer.to(torch.bfloat16)
    x = torch.randn(2, 64).bfloat16()
    before = layer(x)  # F.linear on the loaded dense weight
    # The dense fallback kept (int4_tiles_max_m=0; by default AMX CPUs keep none:
    # test_int4_tiles.py).
    layer.finalize_linear(LinearPolicy(quantization="auto", int4_tiles_max_m=0))
    assert isinstance(layer.method, Int4GroupwiseLinear) and layer.weight is None
    assert _rel(layer(x), before.float()) < TOL[torch.bfloat16]
    by_format = weight_bytes_by_format(layer)
    assert by_format["int4 groupwise"] == layer.method.own_bytes()
    fallback_key = next(k for k in by_format if "fallback" in k)
    assert by_format[fallback_key] == 64 * 64 * 2  # the dense bf16 copy
    # A layer whose pieces are not all int4 (q int4, k dense) stays dense.
    mixed = ColumnParallelLinear(64, [even_shard("q", 32, SINGLE, "q"),
                                      even_shard("k", 32, SINGLE, "k")], bias=False, ctx=SINGLE)
    mixed.to(torch.bfloat16)
    half = groups.rows(0, 32)
    mixed.load("weight", QuantizedCheckpointTensor(half.dequantize().bfloat16(), half), "q")
    mixed.load("weight", half.dequantize().bfloat16(), "k")
    mixed.finalize_linear(LinearPolicy(quantization="auto"))
    assert isinstance(mixed.method, BF16_DENSE)


def _int4_tp_rank(rank: int, world: int, addr: str) -> None:
    child_setup()
    dist.init_process_group("gloo", init_method=f"tcp://{addr}", world_size=world, rank=rank)
    try:
        ctx = ParallelContext(tp_rank=rank, tp_size=world)
        up_g, down_g = _int4(128, 64, seed=3), _int4(64, 128, seed=4)
        up_w, down_w = up_g.dequantize(), down_g.dequantize()
        x = torch.randn(7, 64, generator=torch.Generator().manual_seed(5)).bfloat16()
        policy = LinearPolicy(quantization="auto", small_batch_max_m=64)
        up = ColumnParallelLinear(64, [even_shard(None, 128, ctx, "rows")], bias=False, ctx=ctx)
        down = RowParallelLinear(128, 64, bias=False, ctx=ctx)
        for layer, g, w in ((up, up_g, up_w), (down, down_g, down_w)):
            layer.to(torch.bfloat16)
            layer.load("weight", QuantizedCheckpointTensor(w.bfloat16(), g), None)
            layer.finalize_linear(policy)
            assert isinstance(layer.method, Int4GroupwiseLinear)  # each rank packs its shard
        # Column: this rank's output features; row: the all-reduced full output.
        n = 128 // world
        ref_up = F.linear(x.float(), up_w)
        assert _rel(up(x), ref_up[:, rank * n:(rank + 1) * n]) < TOL[torch.bfloat16]
        h = ref_up.bfloat16()
        ref_down = F.linear(h.float(), down_w)
        assert _rel(down(h[:, rank * n:(rank + 1) * n]), ref_down) < TOL[torch.bfloat16]
    finally:
        dist.destroy_process_group()


def test_int4_layers_under_tp2() -> None:
    spawn_ranks(_int4_tp_rank, lambda: (2, f"127.0.0.1:{free_port()}"), nprocs=2)


@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_model_with_each_dense_policy_matches_plain_f_linear(tiny_llama_dir, quantization) -> None:
    """A whole (tiny HF) model in bf16: prepacked dense and int8 weight-only layers give
    the logits of F.linear on the same checkpoint, within the format's error."""
    from radixlm.models import load_model
    from tests.conftest_models import PoolHarness, rel_err

    ids = list(range(5, 25))
    ref_model, config = load_model(tiny_llama_dir, torch.bfloat16, "cpu",
                                   linear_policy=LinearPolicy(prepack=False))
    model, _ = load_model(tiny_llama_dir, torch.bfloat16, "cpu",
                          linear_policy=LinearPolicy(quantization=quantization))
    want = Int8WeightOnlyLinear if quantization == "int8" else BF16_DENSE
    assert isinstance(model.model.layers[0].mlp.down_proj.method, want)
    assert isinstance(ref_model.model.layers[0].mlp.down_proj.method, DenseLinear)
    outs = []
    for m in (ref_model, model):
        h = PoolHarness(m, config)
        row = h.new_request()
        prompt = h.extend([row], [ids], all_logits=True)  # 20 rows: dense (fallback) path
        outs.append((prompt, h.decode([row], [7])[0]))  # 1 row: the int8 kernel
    tol = 5e-2 if quantization == "int8" else 1e-3
    assert rel_err(outs[1][0].float(), outs[0][0].float()) < tol
    assert rel_err(outs[1][1].float(), outs[0][1].float()) < tol


def test_w8a8_refused_without_int8_dot_products(monkeypatch) -> None:
    """Without VNNI / AMX-INT8, oneDNN's int8 GEMM saturates 16-bit sums (AVX2): the engine
    refuses --quantization w8a8_int8 with the reason instead of serving wrong logits."""
    from radixlm.runtime import cpu_features

    monkeypatch.setattr(cpu_features, "int8_dot_products", lambda: False)
    with pytest.raises(ValueError, match="int8 dot products"):
        make_linear_method(torch.randn(32, 64), None, LinearPolicy("w8a8_int8"))
