"""Tensor-parallel layers: sharded (2 gloo ranks) == unsharded, and the head placement.

The spawned test runs every layer on 2 ranks, each loading its slice from the same full
tensors, and compares with the plain computation on the full tensors.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from radixlm.runtime.distributed import free_port
from radixlm.models.linear import DenseLinear
from radixlm.models.parallel_context import SINGLE, ParallelContext, kv_head_range
from radixlm.models.parallel_layers import (ColumnParallelLinear, ParallelLMHead,
                                            RowParallelLinear, VocabParallelEmbedding,
                                            even_shard, parallel_logits, qkv_shards)
from tests.tp_harness import child_setup, spawn_ranks

TOL = 1e-5


def test_kv_head_range_split_and_replicated() -> None:
    assert [kv_head_range(4, 2, r) for r in range(2)] == [(0, 2), (2, 4)]
    assert [kv_head_range(2, 2, r) for r in range(2)] == [(0, 1), (1, 2)]
    # Fewer KV heads than ranks: each head on tp/kv consecutive ranks.
    assert [kv_head_range(1, 2, r) for r in range(2)] == [(0, 1), (0, 1)]
    assert [kv_head_range(2, 4, r) for r in range(4)] == [(0, 1), (0, 1), (1, 2), (1, 2)]
    with pytest.raises(ValueError):
        kv_head_range(3, 2, 0)
    with pytest.raises(ValueError):
        kv_head_range(2, 3, 0)


def test_rank_q_heads_use_only_the_rank_kv_heads() -> None:
    """GQA: Q head i uses KV head i // (heads / kv); a rank's Q heads must all map into
    its own KV head range."""
    for heads, kv, tp in [(8, 2, 2), (8, 2, 4), (8, 1, 4), (8, 8, 4), (4, 1, 2)]:
        group = heads // kv
        for r in range(tp):
            k0, k1 = kv_head_range(kv, tp, r)
            q_heads = range(r * heads // tp, (r + 1) * heads // tp)
            assert all(k0 <= i // group < k1 for i in q_heads), (heads, kv, tp, r)


def test_single_rank_layers_equal_plain_layers() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 8, generator=g)
    w, b = torch.randn(6, 8, generator=g), torch.randn(6, generator=g)
    col = ColumnParallelLinear(8, [even_shard(None, 6, SINGLE, "rows")], bias=True, ctx=SINGLE)
    col.load("weight", w, None)
    col.load("bias", b, None)
    assert torch.equal(col(x), F.linear(x, w, b))
    row = RowParallelLinear(8, 6, bias=True, ctx=SINGLE)
    row.load("weight", w, None)
    row.load("bias", b, None)
    assert torch.equal(row(x), F.linear(x, w, b))
    with pytest.raises(ValueError, match="shape mismatch"):
        row.load("weight", w.t(), None)


def _layers_rank(rank: int, world: int, addr: str) -> None:
    child_setup()
    dist.init_process_group("gloo", init_method=f"tcp://{addr}", world_size=world, rank=rank)
    try:
        _check_layers(ParallelContext(tp_rank=rank, tp_size=world))
    finally:
        dist.destroy_process_group()


def _check_layers(ctx: ParallelContext) -> None:
    g = torch.Generator().manual_seed(0)  # same tensors on every rank
    hidden, inter, vocab, t = 16, 24, 11, 5  # vocab 11: the last rank's shard is padded
    x = torch.randn(t, hidden, generator=g)

    # gate_up (column, fused) -> down (row, bias): the MLP pairing, one all-reduce.
    wg, wu, wd = (torch.randn(inter, hidden, generator=g), torch.randn(inter, hidden, generator=g),
                  torch.randn(hidden, inter, generator=g))
    bg, bu, bd = (torch.randn(inter, generator=g), torch.randn(inter, generator=g),
                  torch.randn(hidden, generator=g))
    col = ColumnParallelLinear(hidden, [even_shard(s, inter, ctx, "f") for s in ("gate", "up")],
                               bias=True, ctx=ctx)
    for shard, w, b in (("gate", wg, bg), ("up", wu, bu)):
        col.load("weight", w, shard)
        col.load("bias", b, shard)
    row = RowParallelLinear(inter, hidden, bias=True, ctx=ctx)
    row.load("weight", wd, None)
    row.load("bias", bd, None)
    assert col.weight.shape == (2 * inter // ctx.tp_size, hidden)
    gate, up = col(x).chunk(2, dim=-1)
    got = row(F.silu(gate) * up)
    ref = F.linear(F.silu(F.linear(x, wg, bg)) * F.linear(x, wu, bu), wd, bd)
    assert (got - ref).abs().max() <= TOL * ref.abs().max()

    # qkv: the rank's rows are exactly its Q heads and its KV heads (4 heads, 1 KV head:
    # replicated on both ranks).
    heads, kv, d = 4, 1, 4
    wq, wk, wv = (torch.randn(heads * d, hidden, generator=g), torch.randn(kv * d, hidden, generator=g),
                  torch.randn(kv * d, hidden, generator=g))
    qkv = ColumnParallelLinear(hidden, qkv_shards(heads, kv, d, ctx), bias=False, ctx=ctx)
    for shard, w in (("q", wq), ("k", wk), ("v", wv)):
        qkv.load("weight", w, shard)
    q_local = heads // ctx.tp_size * d
    q0 = ctx.tp_rank * q_local
    assert torch.equal(qkv.weight[:q_local], wq[q0:q0 + q_local])
    assert torch.equal(qkv.weight[q_local:q_local + d], wk)
    assert torch.equal(qkv.weight[q_local + d:], wv)

    # Vocab-parallel embedding: exact (the other ranks add zeros).
    emb_w = torch.randn(vocab, hidden, generator=g)
    emb = VocabParallelEmbedding(vocab, hidden, ctx)
    emb.load("weight", emb_w, None)
    ids = torch.tensor([0, 10, 5, 6, 3, 10, 1])
    assert torch.equal(emb(ids), F.embedding(ids, emb_w))

    # LM head: every rank gets all vocab columns, the padding cut off.
    head = ParallelLMHead(vocab, hidden, ctx)
    head.load("weight", emb_w, None)
    logits = parallel_logits(x, DenseLinear(head.weight), vocab, ctx)
    ref = F.linear(x, emb_w)
    assert logits.shape == (t, vocab)
    assert (logits - ref).abs().max() <= TOL * ref.abs().max()
    # ... and identical bits on every rank (the ranks sample from them independently).
    other = logits.clone()
    dist.broadcast(other, src=0)
    assert torch.equal(other, logits)


def test_two_ranks_sharded_equals_unsharded() -> None:
    spawn_ranks(_layers_rank, lambda: (2, f"127.0.0.1:{free_port()}"), nprocs=2)
