"""k-quant GGUF tensors kept at their own size: Q4_K -> Int4Groups and Q8_0 / Q5_0 / Q6_K
-> Int8Groups equal the `gguf` package's dequantization bit for bit (random blocks); the
int8_groups kernel computes x @ W.T of those exact values (x quantized per group, any M); the
method without a dense fallback (an LM head) gives the same for large calls by
dequantizing row blocks; an embedding lookup from the int8 rows equals the dense lookup."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize as gguf_dequantize

from radixlm.models import gguf_int4, gguf_int8
from radixlm.models.linear import int8_groups as int8_groups_mod
from radixlm.models.linear.int8_groups import (Int8Groups, Int8GroupwiseLinear,
                                               int8_groups_kernel)
from tests.unit.test_gguf_dequant import _random_blocks

ROWS = 32


def _gguf_ref(raw: np.ndarray, t: T, rows: int, cols: int) -> torch.Tensor:
    data = raw.reshape(rows, -1)
    return torch.from_numpy(np.ascontiguousarray(gguf_dequantize(data, t).reshape(rows, cols)))


def test_q4_k_int4_groups_are_exact():
    cols = 512
    raw = _random_blocks(T.Q4_K, ROWS * cols // 256, seed=7)
    groups = gguf_int4.int4_groups_from_blocks(raw.reshape(ROWS, -1), T.Q4_K, ROWS, cols)
    assert groups.group_size == 32 and int(groups.q.max()) <= 15
    assert torch.equal(groups.dequantize(), _gguf_ref(raw, T.Q4_K, ROWS, cols))


@pytest.mark.parametrize("t", [T.Q8_0, T.Q5_0, T.Q6_K], ids=lambda t: t.name)
def test_int8_groups_are_exact(t):
    cols = 512
    per = 256 if t == T.Q6_K else 32
    raw = _random_blocks(t, ROWS * cols // per, seed=int(t))
    groups = gguf_int8.int8_groups_from_blocks(raw.reshape(ROWS, -1), t, ROWS, cols)
    assert groups.q.dtype == torch.int8 and groups.group_size == (16 if t == T.Q6_K else 32)
    assert torch.equal(groups.dequantize(), _gguf_ref(raw, t, ROWS, cols))


def _groups(rows: int = 48, cols: int = 256, group: int = 32, seed: int = 0) -> Int8Groups:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-128, 128, (rows, cols), generator=g, dtype=torch.int8)
    s = torch.rand(rows, cols // group, generator=g) * 1e-2
    return Int8Groups(q, s, group)


needs_kernel = pytest.mark.skipif(int8_groups_kernel() is None,
                                  reason="the int8_groups C++ kernel did not build here")


@needs_kernel
@pytest.mark.parametrize("group", [16, 32])
@pytest.mark.parametrize("m", [1, 3, 4, 7, 33])
def test_kernel_matches_float32_reference(m: int, group: int):
    groups = _groups(group=group)
    x = torch.randn(m, 256)
    a, d = int8_groups_kernel().quantize_activations(x, group)  # x per group to int8
    xq = (a.float().view(m, -1, group) * d.unsqueeze(-1)).view(m, 256)
    want = xq @ groups.dequantize().t()
    got = int8_groups_kernel().int8_group_matmul(x, groups.q, groups.s, group)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("m", [1, 8, 9, 20])
def test_head_without_fallback_small_and_chunked(m: int, monkeypatch):
    """Past max_m the head dequantizes blocks of rows (3 blocks here) in the run dtype."""
    monkeypatch.setattr(int8_groups_mod, "_CHUNK_ROWS", 20)
    groups = _groups()
    method = Int8GroupwiseLinear(groups, None, max_m=8)
    x = torch.randn(m, 256).bfloat16()
    got = method(x)
    assert got.dtype == torch.bfloat16 and got.shape == (m, 48)
    want = F.linear(x.float(), groups.dequantize().bfloat16().float())
    # bf16 outputs of magnitude ~10: half an ulp is 0.03; the small path's int8
    # activations add about 0.5% of the outputs' scale
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=0.25)
    assert method.bytes_read(m) == 48 * 256 + 48 * 8 * 4
    assert torch.equal(method.dequantized_weight(), groups.dequantize())


@needs_kernel
def test_embedding_lookup_from_int8_rows_equals_dense_lookup():
    groups = _groups()
    method = Int8GroupwiseLinear(groups, None, max_m=8)
    ids = torch.tensor([0, 5, 47, 5, 13])
    want = F.embedding(ids, groups.dequantize().bfloat16())
    assert torch.equal(method.lookup(ids, torch.bfloat16), want)


def test_int8_groups_slicing_and_cat():
    groups = _groups()
    assert torch.equal(groups.rows(8, 16).dequantize(), groups.dequantize()[8:16])
    assert torch.equal(groups.cols(32, 96).dequantize(), groups.dequantize()[:, 32:96])
    assert groups.cols(16, 96) is None  # cuts through a group
    both = Int8Groups.cat([groups.rows(0, 8), groups.rows(8, 48)])
    assert torch.equal(both.dequantize(), groups.dequantize())
    assert Int8Groups.cat([groups, _groups(group=16)]) is None
