"""The speculative verify's attention on the CPU: a TARGET_VERIFY batch run as decode rows
through the C++ kernel (one row per token, its length position + 1) equals the extend
path (per request SDPA with the causal mask over prefix + drafts), and leaves the same
pool."""

from __future__ import annotations

import pytest
import torch

from radixlm.attention.torch_backend import TorchAttentionBackend
from radixlm.cpu_kernels.ops import decode_attention_available
from radixlm.forward_batch import ForwardBatch, ForwardMode
from tests.attention_fixtures import fake_layer, scattered_pools

pytestmark = pytest.mark.skipif(not decode_attention_available(),
                                reason="the C++ CPU kernel did not build (needs g++ and ninja)")


def _verify_batch(prefix: list[int], ext: list[int], kvh: int, d: int, dtype: torch.dtype,
                  seed: int):
    """Pools with random prefix K/V for requests on scattered rows and slots, and the
    TARGET_VERIFY ForwardBatch of `ext[i]` new tokens (newest + drafts) per request."""
    g = torch.Generator().manual_seed(seed)
    b = len(prefix)
    r2t_pool, kv, rows = scattered_pools([p + e for p, e in zip(prefix, ext)], kvh, d, dtype,
                                         g, spare=3)
    positions = torch.cat([torch.arange(p, p + e) for p, e in zip(prefix, ext)])
    loc = torch.cat([r2t_pool.req_to_token[rows[i], prefix[i]:prefix[i] + ext[i]].long()
                     for i in range(b)])
    seq = [p + e for p, e in zip(prefix, ext)]
    t = sum(ext)
    fb = ForwardBatch(forward_mode=ForwardMode.TARGET_VERIFY, batch_size=b,
                      input_ids=torch.zeros(t, dtype=torch.int64), positions=positions,
                      req_pool_indices=rows, seq_lens=torch.tensor(seq), out_cache_loc=loc,
                      logits_indices=torch.arange(t), seq_lens_cpu=seq,
                      extend_prefix_lens_cpu=prefix, extend_seq_lens_cpu=ext,
                      req_pool_indices_cpu=rows.tolist(),
                      req_to_token_pool=r2t_pool, token_to_kv_pool=kv)
    return fb, g


def _run_both(fb: ForwardBatch, g: torch.Generator, heads: int, kvh: int, d: int,
              dtype: torch.dtype, window: int | None = None):
    """(output, pool) through the kernel rows and through the extend loop, each from the
    same starting pool."""
    t = fb.input_ids.shape[0]
    q = (2 * torch.randn(t, heads, d, generator=g)).to(dtype)
    k = torch.randn(t, kvh, d, generator=g).to(dtype)
    v = torch.randn(t, kvh, d, generator=g).to(dtype)
    kv = fb.token_to_kv_pool
    start = (kv.k_buffers[0].clone(), kv.v_buffers[0].clone())
    results = []
    for verify_kernel in (True, False):
        kv.k_buffers[0].copy_(start[0])
        kv.v_buffers[0].copy_(start[1])
        backend = TorchAttentionBackend(decode_kernel=True, verify_kernel=verify_kernel)
        backend.init_forward_metadata(fb)
        assert (backend.verify_md is not None) is verify_kernel
        out = backend.forward(q, k, v, fake_layer(heads, kvh, d, window), fb)
        results.append((out, kv.k_buffers[0].clone(), kv.v_buffers[0].clone()))
    return results


TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kvh,d", [(9, 3, 64), (4, 4, 32), (8, 1, 128), (4, 2, 16)])
@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_kernel_rows_equal_the_extend_path(dtype, heads, kvh, d, k):
    """Single request, k drafts; several requests with different k (one without a draft:
    a one-token row) and prefixes of 1 to 40 tokens; GQA groups of 3, 1 and 8."""
    for prefix, ext in (([17], [k + 1]), ([40, 1, 9], [k + 1, 1, max(1, k - 1) + 1])):
        fb, g = _verify_batch(prefix, ext, kvh, d, dtype, seed=heads * d + k)
        (out, kb, vb), (ref, kb_ref, vb_ref) = _run_both(fb, g, heads, kvh, d, dtype)
        assert out.dtype == dtype and out.shape == ref.shape
        torch.testing.assert_close(out.float(), ref.float(), rtol=TOL[dtype], atol=TOL[dtype])
        assert torch.equal(kb, kb_ref) and torch.equal(vb, vb_ref)


@pytest.mark.parametrize("window", [1, 3, 1000])
def test_kernel_rows_respect_a_sliding_window(window):
    """Row j at position p sees (p - window, p]: the window moves with the draft row."""
    fb, g = _verify_batch([12, 5], [5, 3], 2, 32, torch.float32, seed=window)
    (out, *_), (ref, *_) = _run_both(fb, g, 4, 2, 32, torch.float32, window)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_rows_are_causal_within_the_draft():
    """A later draft's K/V does not reach an earlier row: changing the last draft's new
    K/V leaves every other row's output as it was and changes the last row's."""
    fb, g = _verify_batch([10], [5], 2, 16, torch.float32, seed=11)
    q = torch.randn(5, 4, 16, generator=g)
    k = torch.randn(5, 2, 16, generator=g)
    v = torch.randn(5, 2, 16, generator=g)
    kv = fb.token_to_kv_pool
    start = (kv.k_buffers[0].clone(), kv.v_buffers[0].clone())
    backend = TorchAttentionBackend(decode_kernel=True)
    outs = []
    for scale in (1.0, -3.0):
        kv.k_buffers[0].copy_(start[0])
        kv.v_buffers[0].copy_(start[1])
        k2, v2 = k.clone(), v.clone()
        k2[-1] *= scale
        v2[-1] *= scale
        backend.init_forward_metadata(fb)
        outs.append(backend.forward(q, k2, v2, fake_layer(4, 2, 16, None), fb))
    torch.testing.assert_close(outs[0][:-1], outs[1][:-1], rtol=0, atol=0)
    assert not torch.allclose(outs[0][-1], outs[1][-1], atol=1e-3)


def test_other_modes_keep_their_paths():
    """An EXTEND batch of the same layout never takes the verify rows."""
    fb, _ = _verify_batch([6], [3], 2, 16, torch.float32, seed=1)
    fb.forward_mode = ForwardMode.EXTEND
    backend = TorchAttentionBackend(decode_kernel=True)
    backend.init_forward_metadata(fb)
    assert backend.verify_md is None and backend.extend_md is not None
