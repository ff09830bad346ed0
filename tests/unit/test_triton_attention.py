"""The triton attention backend against the torch backend (the reference).

On a machine without CUDA the kernels run in Triton's interpreter (TRITON_INTERPRET=1,
set below before triton is imported), on small shapes. With CUDA (scripts/gpu_check.sh)
the same tests run compiled on the GPU, in bf16 too.

Each case builds pools whose KV slots are scattered (a random permutation of slots, or of
whole pages for page_size > 1) and whose requests sit in non-consecutive req_to_token rows,
so the kernels must follow req_to_token to find every position.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

from radixlm.attention.factory import triton_available  # noqa: E402

pytestmark = pytest.mark.skipif(not triton_available(),
                                reason="triton is not installed (pip install triton)")

from radixlm.attention import RadixAttention  # noqa: E402
from radixlm.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from radixlm.forward_batch import ForwardBatch, ForwardMode  # noqa: E402
from radixlm.mem import ReqToTokenPool, TokenToKVPool  # noqa: E402

DEVICE = torch.device("cuda" if ON_GPU else "cpu")
DTYPES = [torch.float32, torch.bfloat16] if ON_GPU else [torch.float32]


def _small_config():
    """Tiny tiles so that small shapes still run several blocks and several KV splits."""
    from radixlm.attention.triton_backend import TritonAttentionConfig

    return TritonAttentionConfig(max_kv_splits=4, min_split_tokens=8, decode_block_n=16,
                                 extend_block_m=16, extend_block_n=16)


def _triton_backend(config=None):
    from radixlm.attention.triton_backend import TritonAttentionBackend

    return TritonAttentionBackend(DEVICE, config if config is not None else _small_config())


def _scattered_slots(total: int, page_size: int, gen: torch.Generator) -> torch.Tensor:
    """`total` distinct slots >= 1 for consecutive positions: random pages, in-page order."""
    pages = (total + page_size - 1) // page_size
    perm = torch.randperm(pages * 2, generator=gen)[:pages]  # pool has twice the pages needed
    pos = torch.arange(total)
    return perm[pos // page_size] * page_size + 1 + pos % page_size


def _make_batch(mode: ForwardMode, prefix_lens: list[int], extend_lens: list[int], heads: int,
                kv_heads: int, head_dim: int, page_size: int, dtype: torch.dtype, seed: int):
    """A forward batch whose prefixes' K/V are already in the pool; returns
    (ForwardBatch without backend, q, k, v, layer)."""
    gen = torch.Generator().manual_seed(seed)
    batch = len(prefix_lens)
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    # Each request gets its own page-aligned run of slots so pages are never shared.
    per_req = [(s + page_size - 1) // page_size * page_size for s in seq_lens]
    slots = _scattered_slots(sum(per_req), page_size, gen)
    pool_size = int(slots.max()) + page_size
    rows = random.Random(seed).sample(range(2 * batch + 1), batch)
    r2t = ReqToTokenPool(2 * batch + 1, max(seq_lens) + 3, DEVICE)
    kv = TokenToKVPool(pool_size, 1, kv_heads, head_dim, dtype, DEVICE)
    out_cache_loc, offset = [], 0
    for row, p, s, n in zip(rows, prefix_lens, seq_lens, per_req):
        req_slots = slots[offset:offset + s]
        offset += n
        r2t.req_to_token[row, :s] = req_slots.to(DEVICE, torch.int32)
        kv.k_buffers[0][req_slots[:p].to(DEVICE)] = torch.randn(p, kv_heads, head_dim, generator=gen).to(DEVICE, dtype)
        kv.v_buffers[0][req_slots[:p].to(DEVICE)] = torch.randn(p, kv_heads, head_dim, generator=gen).to(DEVICE, dtype)
        out_cache_loc.append(req_slots[p:])
    t = sum(extend_lens)
    q = torch.randn(t, heads, head_dim, generator=gen).to(DEVICE, dtype)
    k = torch.randn(t, kv_heads, head_dim, generator=gen).to(DEVICE, dtype)
    v = torch.randn(t, kv_heads, head_dim, generator=gen).to(DEVICE, dtype)
    positions = torch.cat([torch.arange(p, s) for p, s in zip(prefix_lens, seq_lens)])
    fb = ForwardBatch(
        forward_mode=mode, batch_size=batch,
        input_ids=torch.zeros(t, dtype=torch.int64, device=DEVICE),
        positions=positions.to(DEVICE),
        req_pool_indices=torch.tensor(rows, dtype=torch.int64, device=DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=DEVICE),
        out_cache_loc=torch.cat(out_cache_loc).to(DEVICE),
        logits_indices=torch.tensor(seq_lens, device=DEVICE).cumsum(0) - 1,
        seq_lens_cpu=seq_lens,
        extend_prefix_lens_cpu=None if mode.is_decode() else prefix_lens,
        extend_seq_lens_cpu=None if mode.is_decode() else extend_lens,
        req_to_token_pool=r2t, token_to_kv_pool=kv)
    layer = RadixAttention(heads, kv_heads, head_dim, scaling=head_dim ** -0.5, layer_id=0)
    return fb, q, k, v, layer


def _clone_pool(kv: TokenToKVPool) -> TokenToKVPool:
    twin = TokenToKVPool(kv.size, kv.num_layers, kv.kv_heads, kv.head_dim, kv.dtype, kv.device)
    for dst, src in zip(twin.k_buffers + twin.v_buffers, kv.k_buffers + kv.v_buffers):
        dst.copy_(src)
    return twin


def _run(backend, fb: ForwardBatch, q, k, v, layer) -> torch.Tensor:
    fb.attn_backend = backend
    backend.init_forward_metadata(fb)
    return backend.forward(q, k, v, layer, fb)


def _compare(fb, q, k, v, layer, config=None) -> None:
    import dataclasses

    ref_fb = dataclasses.replace(fb, token_to_kv_pool=_clone_pool(fb.token_to_kv_pool))
    expected = _run(TorchAttentionBackend(), ref_fb, q, k, v, layer)
    got = _run(_triton_backend(config), fb, q, k, v, layer)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    tol = 2e-2 if q.dtype == torch.bfloat16 else 2e-5
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)
    # Both backends write the new K/V into the pool at out_cache_loc.
    torch.testing.assert_close(fb.token_to_kv_pool.k_buffers[0], ref_fb.token_to_kv_pool.k_buffers[0])
    torch.testing.assert_close(fb.token_to_kv_pool.v_buffers[0], ref_fb.token_to_kv_pool.v_buffers[0])


# (seq_lens or prefix/extend lens, page_size, heads, kv_heads, head_dim): each GQA ratio
# (1, 4, 6) and each page size meets short and multi-block lengths; head_dim 24 is masked
# up to a 32-wide tile.
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seq_lens,page_size,heads,kv_heads,head_dim", [
    ([1], 1, 4, 4, 16),
    ([1], 4, 6, 1, 24),
    ([5, 40, 17], 1, 8, 2, 16),
    ([5, 40, 17], 4, 4, 4, 16),
    ([33, 2, 64, 9, 1], 4, 8, 2, 16),
    ([70, 9], 1, 6, 1, 24),
])
def test_decode_matches_torch(seq_lens, page_size, heads, kv_heads, head_dim, dtype):
    # Decode: position seq_len - 1 is the new token, the rest is the cached prefix. With
    # min_split_tokens=8 and at most 4 splits, lengths 1..70 take 1 to 4 splits.
    fb, q, k, v, layer = _make_batch(ForwardMode.DECODE, [s - 1 for s in seq_lens],
                                     [1] * len(seq_lens), heads, kv_heads, head_dim,
                                     page_size, dtype, seed=sum(seq_lens) + page_size)
    _compare(fb, q, k, v, layer)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("prefix_lens,extend_lens,page_size,heads,kv_heads,head_dim", [
    ([0], [1], 1, 4, 4, 16),
    ([0], [37], 4, 8, 2, 16),  # no prefix, several query and key blocks
    ([21], [5], 1, 6, 1, 24),
    ([21], [5], 4, 4, 4, 16),
    ([0, 16, 3], [20, 40, 1], 1, 8, 2, 16),
    ([40, 0, 7, 1], [1, 3, 33, 16], 4, 6, 1, 24),
])
def test_extend_matches_torch(prefix_lens, extend_lens, page_size, heads, kv_heads, head_dim,
                              dtype):
    fb, q, k, v, layer = _make_batch(ForwardMode.EXTEND, prefix_lens, extend_lens, heads,
                                     kv_heads, head_dim, page_size, dtype,
                                     seed=sum(prefix_lens) * 31 + sum(extend_lens))
    _compare(fb, q, k, v, layer)


def test_decode_empty_tail_split():
    # 9 tokens, min 2 per split -> 5 splits, capped at 4 -> ceil(9 / 4) = 3 per split: splits
    # 0..2 cover all 9 tokens and split 3 is empty; both stages must skip it.
    from radixlm.attention.triton_backend import TritonAttentionConfig

    config = TritonAttentionConfig(max_kv_splits=4, min_split_tokens=2, decode_block_n=16)
    fb, q, k, v, layer = _make_batch(ForwardMode.DECODE, [8, 4, 2], [1, 1, 1], 4, 2, 16, 1,
                                     DTYPES[-1], seed=11)
    _compare(fb, q, k, v, layer, config)


@pytest.mark.parametrize("page_size", [1, 4])
def test_mixed_matches_torch(page_size):
    # MIXED: a prefill chunk on top of a cached prefix plus running decodes riding along as
    # one-token extends at position kv_len; all through the extend path.
    fb, q, k, v, layer = _make_batch(ForwardMode.MIXED, [12, 30, 0, 5], [19, 1, 1, 1], 8, 2,
                                     16, page_size, DTYPES[-1], seed=7)
    _compare(fb, q, k, v, layer)


def test_default_tiles_match_torch():
    """The shipped tiling (64-wide blocks, 16 splits of >= 256 tokens) on one mixed case."""
    from radixlm.attention.triton_backend import TritonAttentionConfig

    config = TritonAttentionConfig()
    fb, q, k, v, layer = _make_batch(ForwardMode.EXTEND, [70, 0], [9, 66], 8, 2, 16, 1,
                                     DTYPES[-1], seed=3)
    _compare(fb, q, k, v, layer, config)
    fb, q, k, v, layer = _make_batch(ForwardMode.DECODE, [300, 5], [1, 1], 8, 2, 16, 1,
                                     DTYPES[-1], seed=4)
    _compare(fb, q, k, v, layer, config)


def test_num_kv_splits_clamped_per_request():
    from radixlm.attention.triton_kernels.decode_attention import num_kv_splits_for

    got = num_kv_splits_for(torch.tensor([1, 8, 9, 100, 10_000]), max_kv_splits=4,
                            min_split_tokens=8)
    assert got.tolist() == [1, 1, 2, 4, 4]


def test_backend_registry():
    from radixlm.attention import create_attention_backend
    from radixlm.attention.factory import resolve_attention_backend_name
    from radixlm.attention.triton_backend import TritonAttentionBackend

    assert resolve_attention_backend_name("auto", torch.device("cpu")) == "torch"
    assert resolve_attention_backend_name("auto", torch.device("cuda")) == "triton"
    assert isinstance(create_attention_backend("triton", DEVICE), TritonAttentionBackend)
    with pytest.raises(ValueError, match="unknown attention backend"):
        create_attention_backend("flash", DEVICE)
