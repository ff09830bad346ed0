"""The torch backend's extend attention: runs of consecutive prefix-free requests of one
length are one batched SDPA call over the step's own K/V, the other requests one call each
over K/V gathered from the pool; both equal a float64 reference of causal attention over
what the pool holds, with prefixes, sliding windows and a pool dtype other than q's."""

from __future__ import annotations

import pytest
import torch

from radixlm.attention.torch_backend import TorchAttentionBackend, prefix_free_runs
from radixlm.forward_batch import ForwardBatch, ForwardMode
from tests.attention_fixtures import fake_layer, scattered_pools


def test_runs_group_consecutive_prefix_free_requests_of_one_length():
    assert prefix_free_runs([], []) == []
    assert prefix_free_runs([0, 0, 0], [4, 4, 4]) == [(0, 3)]
    assert prefix_free_runs([0, 0, 5, 0, 0, 0], [4, 4, 3, 6, 6, 2]) == [
        (0, 2), (2, 1), (3, 2), (5, 1)]
    # A request with a prefix is always alone, even beside equal lengths.
    assert prefix_free_runs([3, 3, 0], [4, 4, 4]) == [(0, 1), (1, 1), (2, 1)]


def _extend_batch(prefix: list[int], ext: list[int], kvh: int, d: int, kv_dtype: torch.dtype,
                  g: torch.Generator) -> ForwardBatch:
    """Pools with random prefix K/V for requests on scattered rows and slots, and the
    EXTEND ForwardBatch of ext[i] new tokens after prefix[i] cached ones."""
    b, seq = len(prefix), [p + e for p, e in zip(prefix, ext)]
    r2t, kv, rows = scattered_pools(seq, kvh, d, kv_dtype, g)
    t = sum(ext)
    loc = torch.cat([r2t.req_to_token[rows[i], prefix[i]:seq[i]].long() for i in range(b)])
    return ForwardBatch(
        forward_mode=ForwardMode.EXTEND, batch_size=b, input_ids=torch.zeros(t, dtype=torch.int64),
        positions=torch.cat([torch.arange(p, s) for p, s in zip(prefix, seq)]),
        req_pool_indices=rows, seq_lens=torch.tensor(seq), out_cache_loc=loc,
        logits_indices=torch.arange(t), seq_lens_cpu=seq, extend_prefix_lens_cpu=prefix,
        extend_seq_lens_cpu=ext, req_pool_indices_cpu=rows.tolist(),
        req_to_token_pool=r2t, token_to_kv_pool=kv)


def _reference(q: torch.Tensor, fb: ForwardBatch, layer) -> torch.Tensor:
    """Causal (and windowed) attention of every query over its request's pool K/V, float64."""
    kv, r2t = fb.token_to_kv_pool, fb.req_to_token_pool.req_to_token
    group = layer.num_heads // layer.num_kv_heads
    out, off = [], 0
    for row, prefix, ext in zip(fb.req_pool_indices_cpu, fb.extend_prefix_lens_cpu,
                                fb.extend_seq_lens_cpu):
        slots = r2t[row, :prefix + ext].long()
        k = kv.k_buffers[0][slots].double().repeat_interleave(group, 1)  # [seq, heads, d]
        v = kv.v_buffers[0][slots].double().repeat_interleave(group, 1)
        qi = q[off:off + ext].double()
        scores = torch.einsum("thd,shd->hts", qi, k) * layer.scaling
        q_pos = torch.arange(prefix, prefix + ext)[:, None]
        k_pos = torch.arange(prefix + ext)[None, :]
        visible = k_pos <= q_pos
        if layer.sliding_window:
            visible &= k_pos > q_pos - layer.sliding_window
        scores = scores.masked_fill(~visible, float("-inf"))
        out.append(torch.einsum("hts,shd->thd", scores.softmax(-1), v))
        off += ext
    return torch.cat(out)


@pytest.mark.parametrize("dtype,kv_dtype,window", [
    (torch.float32, torch.float32, None), (torch.bfloat16, torch.bfloat16, None),
    (torch.bfloat16, torch.bfloat16, 3), (torch.bfloat16, torch.float32, None)])
def test_extend_equals_the_reference(dtype, kv_dtype, window):
    g = torch.Generator().manual_seed(0)
    heads, kvh, d = 6, 2, 16
    prefix = [0, 0, 0, 5, 0, 0, 0, 4]
    ext = [4, 4, 4, 3, 6, 6, 2, 1]
    fb = _extend_batch(prefix, ext, kvh, d, kv_dtype, g)
    t = sum(ext)
    q = torch.randn(t, heads, d, generator=g).to(dtype)
    # Strided q/k/v, as the model's split of its fused qkv projection gives them.
    qkv = torch.randn(t, (heads + 2 * kvh) * d, generator=g).to(dtype)
    qkv[:, :heads * d] = q.reshape(t, -1)
    q, k, v = (x.view(t, -1, d) for x in qkv.split([heads * d, kvh * d, kvh * d], -1))
    backend = TorchAttentionBackend(decode_kernel=False)
    backend.init_forward_metadata(fb)
    assert backend.extend_md.runs == [(0, 3), (3, 1), (4, 2), (6, 1), (7, 1)]
    layer = fake_layer(heads, kvh, d, window)
    out = backend.forward(q, k, v, layer, fb)
    # The step's K/V went into the pool at out_cache_loc.
    kv = fb.token_to_kv_pool
    torch.testing.assert_close(kv.k_buffers[0][fb.out_cache_loc], k.to(kv_dtype))
    torch.testing.assert_close(kv.v_buffers[0][fb.out_cache_loc], v.to(kv_dtype))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), _reference(q, fb, layer), atol=tol, rtol=tol)


def test_a_batched_run_equals_its_requests_one_at_a_time():
    """The batched call gives each request what a batch of that request alone gives, bit
    for bit (the rows of one request do not depend on the others)."""
    g = torch.Generator().manual_seed(1)
    heads, kvh, d, n, ext = 9, 3, 64, 5, 32
    fb = _extend_batch([0] * n, [ext] * n, kvh, d, torch.bfloat16, g)
    q = torch.randn(n * ext, heads, d, generator=g).to(torch.bfloat16)
    k = torch.randn(n * ext, kvh, d, generator=g).to(torch.bfloat16)
    v = torch.randn(n * ext, kvh, d, generator=g).to(torch.bfloat16)
    layer = fake_layer(heads, kvh, d, None)
    backend = TorchAttentionBackend(decode_kernel=False)
    backend.init_forward_metadata(fb)
    batched = backend.forward(q, k, v, layer, fb)
    for i in range(n):
        one = _extend_batch([0], [ext], kvh, d, torch.bfloat16, torch.Generator().manual_seed(2))
        solo = TorchAttentionBackend(decode_kernel=False)
        solo.init_forward_metadata(one)
        rows = slice(i * ext, (i + 1) * ext)
        assert torch.equal(solo.forward(q[rows], k[rows], v[rows], layer, one), batched[rows])
