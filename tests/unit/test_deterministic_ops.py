"""Batch-invariant building blocks: fixed-tile linear, the deterministic draw."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixlm.executor.sampler import deterministic_uniform, inverse_cdf_draw
from radixlm.models.batch_invariant import BatchInvariantOps


def test_linear_row_does_not_depend_on_batch_size_or_position() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 64, generator=g)
    b = torch.randn(96, generator=g)
    x = torch.randn(1, 64, generator=g)
    ops = BatchInvariantOps(row_tile=8)
    ref = ops.linear(x, w, b)[0]
    for m in (2, 3, 5, 8, 9, 17, 40):
        for pos in (0, m // 2, m - 1):
            xs = torch.randn(m, 64, generator=g)
            xs[pos] = x[0]
            assert torch.equal(ops.linear(xs, w, b)[pos], ref), (m, pos)
    torch.testing.assert_close(ref, F.linear(x, w, b)[0])


def test_uniform_is_a_pure_function_of_seed_and_position() -> None:
    us = [deterministic_uniform(s, p) for s in range(20) for p in range(50)]
    assert us == [deterministic_uniform(s, p) for s in range(20) for p in range(50)]
    assert all(0.0 <= u < 1.0 for u in us) and len(set(us)) == len(us)
    assert abs(sum(us) / len(us) - 0.5) < 0.03


def test_inverse_cdf_draw_never_picks_a_zero_probability_token() -> None:
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0, 2.0]])
    for u in (0.0, 0.25, 0.4999999, 0.5, 0.75, 1.0 - 2 ** -53):
        ids = inverse_cdf_draw(probs, torch.tensor([u, u], dtype=torch.float64)).tolist()
        assert ids[0] in (1, 3) and ids[1] == 4, (u, ids)


def test_draws_follow_the_distribution() -> None:
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4]]).repeat(4000, 1)
    u = torch.tensor([deterministic_uniform(7, p) for p in range(4000)], dtype=torch.float64)
    counts = torch.bincount(inverse_cdf_draw(probs, u), minlength=4).float() / 4000
    torch.testing.assert_close(counts, probs[0], atol=0.03, rtol=0)


@pytest.mark.parametrize("window", [None, 20], ids=["causal", "window20"])
def test_attention_query_does_not_depend_on_chunks_batch_or_decode(window) -> None:
    from types import SimpleNamespace

    from radixlm.attention.batch_invariant_backend import BatchInvariantAttentionBackend
    from radixlm.forward_batch import ForwardMode

    g = torch.Generator().manual_seed(0)
    heads, kvh, d, slots = 6, 2, 16, 1200
    k_buf, v_buf = torch.randn(slots, kvh, d, generator=g), torch.randn(slots, kvh, d, generator=g)
    req_to_token = torch.stack([torch.randperm(slots - 1, generator=g)[:400] + 1
                                for _ in range(6)]).to(torch.int32)
    pool = SimpleNamespace(set_kv=lambda *a: None, get_kv=lambda layer_id: (k_buf, v_buf))
    layer = SimpleNamespace(layer_id=0, num_heads=heads, num_kv_heads=kvh, head_dim=d,
                            scaling=d ** -0.5, sliding_window=window)

    def run(mode: ForwardMode, rows: list[int], prefix: list[int], ext: list[int],
            q: torch.Tensor) -> torch.Tensor:
        fb = SimpleNamespace(forward_mode=mode, batch_size=len(rows),
                             seq_lens_cpu=[p + e for p, e in zip(prefix, ext)],
                             extend_seq_lens_cpu=ext, extend_prefix_lens_cpu=prefix,
                             req_pool_indices=torch.tensor(rows), out_cache_loc=None,
                             req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
                             token_to_kv_pool=pool)
        backend = BatchInvariantAttentionBackend(q_tile=4, kv_tile=16)
        backend.init_forward_metadata(fb)
        return backend.forward(q, None, None, layer, fb)

    def rand(n: int) -> torch.Tensor:
        return torch.randn(n, heads, d, generator=g)

    q = rand(150)
    full = run(ForwardMode.EXTEND, [0], [0], [150], q)
    idx = req_to_token[0, :150].long()
    pos = torch.arange(150)
    mask = pos[None, :] <= pos[:, None]  # causal, and within the window when there is one
    if window is not None:
        mask &= pos[None, :] > pos[:, None] - window
    ref = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k_buf[idx].transpose(0, 1)[None],
        v_buf[idx].transpose(0, 1)[None], attn_mask=mask, scale=d ** -0.5, enable_gqa=True)
    torch.testing.assert_close(full, ref[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
    # The same queries in three chunks, each batched with other requests.
    a = run(ForwardMode.EXTEND, [3, 0], [10, 0], [21, 37], torch.cat([rand(21), q[:37]]))[21:]
    b = run(ForwardMode.EXTEND, [0, 5], [37, 0], [90, 7], torch.cat([q[37:127], rand(7)]))[:90]
    c = run(ForwardMode.EXTEND, [0], [127], [23], q[127:])
    assert torch.equal(torch.cat([a, b, c]), full)
    # The last query as a decode, alone and in batches of other lengths.
    for others in ([], [(1, 30)], [(2, 99), (4, 300), (5, 1)]):
        rows = [0] + [r for r, _ in others]
        prefix = [149] + [p for _, p in others]
        out = run(ForwardMode.DECODE, rows, prefix, [1] * len(rows),
                  torch.cat([q[149:], rand(len(others))]))
        assert torch.equal(out[0], full[149])
