"""Attention-backend test fixtures: a stand-in for a RadixAttention layer and pools of
random K/V holding a batch of requests on scattered req_to_token rows and KV slots."""

from __future__ import annotations

import torch

from radixlm.mem import ReqToTokenPool, TokenToKVPool


def fake_layer(heads: int, kvh: int, d: int, window: int | None = None):
    class _Layer:  # what the backends read of a RadixAttention
        layer_id, num_heads, num_kv_heads, head_dim, scaling = 0, heads, kvh, d, d ** -0.5
        sliding_window = window

    return _Layer()


def scattered_pools(seq_lens: list[int], kvh: int, d: int, dtype: torch.dtype,
                    g: torch.Generator, spare: int = 2):
    """(req_to_token pool, one-layer KV pool of random values, rows [B]): request i on row
    rows[i] with `seq_lens[i] + spare` positions mapped to shuffled slots (never slot 0,
    the dummy)."""
    b, width = len(seq_lens), max(seq_lens) + spare
    r2t = ReqToTokenPool(b + 2, width)
    kv = TokenToKVPool(b * width + 1, 1, kvh, d, dtype)
    kv.k_buffers[0].copy_(torch.randn(kv.k_buffers[0].shape, generator=g).to(dtype))
    kv.v_buffers[0].copy_(torch.randn(kv.v_buffers[0].shape, generator=g).to(dtype))
    rows = torch.randperm(b + 1, generator=g)[:b]
    perm = torch.randperm(b * width, generator=g) + 1
    for i in range(b):
        r2t.req_to_token[rows[i], :width] = perm[i * width:(i + 1) * width].int()
    return r2t, kv, rows
