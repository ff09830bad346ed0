"""The CPU decode attention kernel (cpu_kernels/decode_attention.cpp) against a
plain per-request reference, and the torch backend's use of it. The kernel has a block
path (head_dim a multiple of twice the vector width: 32 with AVX-512, 16 without) and a
row path (other head_dims); the shapes below cover both, GQA groups of 1, 3 and 4 (3
and 4 have their own compiled loop), and lengths around the block size; the block edges
also on the kernel as an AVX2-only CPU builds it (8-float vectors)."""

from __future__ import annotations

import pytest
import torch

from radixlm.cpu_kernels.ops import (decode_attention_available, decode_attention_with_kv_write,
                                     paged_decode_attention)
from radixlm.attention.torch_backend import TorchAttentionBackend

pytestmark = pytest.mark.skipif(not decode_attention_available(),
                                reason="the C++ CPU kernel did not build (needs g++ and ninja)")


def _reference(q, k_buf, v_buf, req_to_token, rows, lens, scale, window=0):
    """Per request and head, softmax(q k^T * scale) v in float64, GQA by head groups, over
    the last `window` positions (0: all)."""
    b, heads, d = q.shape
    group = heads // k_buf.shape[1]
    out = torch.empty(b, heads, d, dtype=torch.float64)
    for i in range(b):
        first = max(0, int(lens[i]) - window) if window else 0
        slots = req_to_token[rows[i], first:lens[i]].long()
        k = k_buf[slots].double()  # [L, kvh, d]
        v = v_buf[slots].double()
        for h in range(heads):
            s = (k[:, h // group] @ q[i, h].double()) * scale
            out[i, h] = torch.softmax(s, 0) @ v[:, h // group]
    return out


@pytest.mark.parametrize("act,pool", [(torch.bfloat16, torch.bfloat16),
                                      (torch.float32, torch.bfloat16)])
def test_kv_first_writes_every_row_before_any_attends(act, pool):
    """kv_first: rows of one request at consecutive positions (a verify's newest token and
    drafts) each see the K/V the rows before them write in the same call, exactly as if
    the pool's set_kv had written them all first."""
    heads, kvh, d, n = 6, 2, 64, 5
    _, k_buf, v_buf, r2t, rows_two, _ = _case(2, heads, kvh, d, pool, 40, seed=11)
    row, base = rows_two[1:2], 30  # the second request: positions base .. base + n - 1 are new
    rows, lens = row.repeat(n), torch.arange(base + 1, base + n + 1)
    loc = r2t[row.item(), base:base + n].long()
    g = torch.Generator().manual_seed(12)
    q = (2 * torch.randn(n, heads, d, generator=g)).to(act)
    k = torch.randn(n, kvh, d, generator=g).to(act)
    v = torch.randn(n, kvh, d, generator=g).to(act)
    k_ref, v_ref = k_buf.clone(), v_buf.clone()
    k_ref[loc], v_ref[loc] = k.to(pool), v.to(pool)
    ref = paged_decode_attention(q, k_ref, v_ref, r2t, rows, lens, 0.125)
    out = decode_attention_with_kv_write(q, k, v, k_buf, v_buf, loc, r2t, rows, lens, 0.125,
                                         kv_first=True)
    assert torch.equal(k_buf, k_ref) and torch.equal(v_buf, v_ref)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def _case(b: int, heads: int, kvh: int, d: int, dtype: torch.dtype, max_len: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    slots_total = b * max_len + 1
    k_buf = torch.randn(slots_total + 1, kvh, d, generator=g).to(dtype)
    v_buf = torch.randn(slots_total + 1, kvh, d, generator=g).to(dtype)
    rows = torch.randperm(b + 2, generator=g)[:b]
    lens = torch.randint(1, max_len + 1, (b,), generator=g)
    lens[0] = 1  # a request on its first decode token / a padding row
    req_to_token = torch.zeros(b + 3, max_len + 8, dtype=torch.int32)
    # Slots scattered over the pool (never slot 0, the dummy), as the allocator leaves them.
    perm = torch.randperm(slots_total - 1, generator=g) + 1
    for i in range(b):
        req_to_token[rows[i], :max_len] = perm[i * max_len:(i + 1) * max_len].int()
    q = (2 * torch.randn(b, heads, d, generator=g)).to(dtype)
    return q, k_buf, v_buf, req_to_token, rows, lens


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("heads,kvh,d", [(4, 2, 16), (9, 3, 64), (4, 4, 32), (8, 1, 128)])
def test_kernel_matches_reference(dtype, tol, heads, kvh, d):
    q, k_buf, v_buf, r2t, rows, lens = _case(5, heads, kvh, d, dtype, 40, seed=heads * d)
    out = paged_decode_attention(q, k_buf, v_buf, r2t, rows, lens, d ** -0.5)
    assert out.dtype == dtype and out.shape == q.shape
    ref = _reference(q, k_buf, v_buf, r2t, rows, lens, d ** -0.5)
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("heads,kvh,d", [(6, 6, 64), (9, 3, 64), (8, 2, 128), (3, 1, 128),
                                         (4, 1, 36), (6, 2, 24)])
@pytest.mark.parametrize("lanes", ["native", 8])
def test_kernel_block_edges_match_reference(dtype, tol, heads, kvh, d, lanes):
    """Lengths 1, 7, 8, 15, 16, 17, 33 and 160 (blocks of 8 or 16 positions and their
    remainders), slots scattered over the pool; head_dims 64/128 (the block path, also
    compiled for a fixed head_dim) and 36/24 (the row path on AVX-512 and AVX2 alike)."""
    q, k_buf, v_buf, r2t, rows, lens = _case(8, heads, kvh, d, dtype, 160, seed=heads + d)
    lens = torch.tensor([1, 7, 8, 15, 16, 17, 33, 160])
    if lanes == "native":
        out = paged_decode_attention(q, k_buf, v_buf, r2t, rows, lens, d ** -0.5)
    else:
        from tests.kernel_variants import variant  # 8-float vectors, as on AVX2-only CPUs

        out = variant("decode_attention", 8).paged_decode_attention(q, k_buf, v_buf, r2t, rows,
                                                                    lens, d ** -0.5, 0)
    ref = _reference(q, k_buf, v_buf, r2t, rows, lens, d ** -0.5)
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("rising", [True, False])
def test_kernel_online_softmax_rescales(rising):
    """Scores that rise (or fall) steeply along the positions: every block of the block
    path sees a new running max (or none), so the rescaling of what it summed so far
    is exercised (a wrong factor shows as a wrong weight of the early positions)."""
    d, n = 64, 100
    q, k_buf, v_buf, r2t, rows, lens = _case(2, 4, 2, d, torch.float32, n, seed=11)
    lens = torch.tensor([n, n - 3])
    ramp = torch.linspace(-1, 1, n) if rising else torch.linspace(1, -1, n)
    for i in range(2):
        slots = r2t[rows[i], :n].long()
        # k = ramp * q-direction of KV head 0 and 1 (heads 0 and 2 of the request).
        k_buf[slots] = ramp.view(n, 1, 1) * q[i, ::2].view(1, 2, d) * 0.6
    out = paged_decode_attention(q, k_buf, v_buf, r2t, rows, lens, d ** -0.5)
    ref = _reference(q, k_buf, v_buf, r2t, rows, lens, d ** -0.5)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [1, 7, 1000])
def test_kernel_sliding_window_matches_reference(window):
    """A query at position L - 1 sees (L - 1 - window, L - 1]: Gemma 3's local layers."""
    q, k_buf, v_buf, r2t, rows, lens = _case(6, 8, 2, 32, torch.float32, 40, seed=window)
    out = paged_decode_attention(q, k_buf, v_buf, r2t, rows, lens, 32 ** -0.5, window)
    ref = _reference(q, k_buf, v_buf, r2t, rows, lens, 32 ** -0.5, window)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    if window < 40:  # the window really cut something off
        full = _reference(q, k_buf, v_buf, r2t, rows, lens, 32 ** -0.5)
        assert not torch.allclose(full, ref, atol=1e-3)


@pytest.mark.parametrize("act,pool", [(torch.float32, torch.float32),
                                      (torch.bfloat16, torch.bfloat16),
                                      (torch.float32, torch.bfloat16)])
def test_kv_write_fused_equals_set_kv_then_attention(act, pool):
    """The eager call writes the step's K/V (strided views of the projection output,
    cast to the pool's dtype) at `loc` and nowhere else, then attends over them."""
    b, heads, kvh, d = 4, 6, 2, 16
    q, k_buf, v_buf, r2t, rows, lens = _case(b, heads, kvh, d, pool, 24, seed=7)
    q = q.to(act)
    loc = torch.stack([r2t[rows[i], lens[i] - 1] for i in range(b)]).long()
    g = torch.Generator().manual_seed(8)
    qkv = torch.randn(b, (heads + 2 * kvh) * d + 5, generator=g).to(act)
    k = qkv[:, heads * d:(heads + kvh) * d].view(b, kvh, d)
    v = qkv[:, (heads + kvh) * d:(heads + 2 * kvh) * d].view(b, kvh, d)
    k_ref, v_ref = k_buf.clone(), v_buf.clone()
    k_ref[loc], v_ref[loc] = k.to(pool), v.to(pool)  # the pool's set_kv
    ref = paged_decode_attention(q, k_ref, v_ref, r2t, rows, lens, 0.25)
    out = decode_attention_with_kv_write(q, k, v, k_buf, v_buf, loc, r2t, rows, lens, 0.25)
    assert torch.equal(k_buf, k_ref) and torch.equal(v_buf, v_ref)  # only loc rewritten
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_kernel_reads_only_the_requests_slots():
    """Poisoning every slot outside the requests' first seq_len positions changes nothing."""
    q, k_buf, v_buf, r2t, rows, lens = _case(3, 4, 2, 16, torch.float32, 20, seed=1)
    out = paged_decode_attention(q, k_buf, v_buf, r2t, rows, lens, 0.25)
    used = torch.zeros(k_buf.shape[0], dtype=torch.bool)
    for i in range(3):
        used[r2t[rows[i], :lens[i]].long()] = True
    k2, v2 = k_buf.clone(), v_buf.clone()
    k2[~used] = float("nan")
    v2[~used] = 1e30
    torch.testing.assert_close(paged_decode_attention(q, k2, v2, r2t, rows, lens, 0.25), out,
                               rtol=0, atol=0)


def test_kernel_accepts_a_strided_query():
    """q as the attention layer passes it: a view of a wider projection output."""
    q, k_buf, v_buf, r2t, rows, lens = _case(2, 4, 2, 16, torch.float32, 10, seed=2)
    wide = torch.cat([q.reshape(2, -1), torch.randn(2, 24)], dim=-1)
    view = wide[:, :64].view(2, 4, 16)
    torch.testing.assert_close(paged_decode_attention(view, k_buf, v_buf, r2t, rows, lens, 0.25),
                               paged_decode_attention(q, k_buf, v_buf, r2t, rows, lens, 0.25))


@pytest.mark.parametrize("window", [None, 5])
def test_backend_decode_equals_the_gather_path(window):
    """The torch backend with the kernel and without it (its gather + matmul fallback)
    give the same decode attention and leave the same pool (the step's K/V written)."""
    from radixlm.forward_batch import ForwardBatch, ForwardMode
    from radixlm.mem import ReqToTokenPool, TokenToKVPool

    class _Layer:
        layer_id, num_heads, num_kv_heads, head_dim, scaling = 0, 4, 2, 16, 0.25
        sliding_window = window  # RadixAttention's (None: full attention)

    q, k_buf, v_buf, r2t, rows, lens = _case(4, 4, 2, 16, torch.float32, 30, seed=3)
    r2t_pool = ReqToTokenPool(r2t.shape[0] - 1, r2t.shape[1])
    r2t_pool.req_to_token.copy_(r2t)
    kv = TokenToKVPool(k_buf.shape[0] - 1, 1, 2, 16, torch.float32)
    outs, pools = [], []
    k_new = torch.randn(4, 2, 16, generator=torch.Generator().manual_seed(4))
    v_new = torch.randn(4, 2, 16, generator=torch.Generator().manual_seed(5))
    for kernel in (True, False):
        kv.k_buffers[0].copy_(k_buf)
        kv.v_buffers[0].copy_(v_buf)
        # This step's token of each request: its last position's slot.
        loc = torch.stack([r2t[rows[i], lens[i] - 1] for i in range(4)]).long()
        fb = ForwardBatch(forward_mode=ForwardMode.DECODE, batch_size=4,
                          input_ids=torch.zeros(4, dtype=torch.int64), positions=lens - 1,
                          req_pool_indices=rows, seq_lens=lens, out_cache_loc=loc,
                          logits_indices=torch.arange(4), seq_lens_cpu=lens.tolist(),
                          req_to_token_pool=r2t_pool, token_to_kv_pool=kv)
        backend = TorchAttentionBackend(decode_kernel=kernel)
        assert backend.supports_decode_graphs is kernel
        backend.init_forward_metadata(fb)
        outs.append(backend.forward(q, k_new, v_new, _Layer(), fb))
        pools.append((kv.k_buffers[0].clone(), kv.v_buffers[0].clone()))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(*pools))
    assert torch.equal(pools[0][0][loc], k_new)


def _bf16_kernel(path):
    """The kernel taking bf16 queries and KV (groups of 3 and 4 on every path) on `path`: 2 the AMX
    tiles, 1 the AVX512-BF16 dot products, 0 the float32 block kernel (the variants are
    this source built without the faster paths; a path the CPU lacks is skipped)."""
    from radixlm.cpu_kernels.build import load_kernel
    from tests.kernel_variants import variant

    native = load_kernel("decode_attention")
    if native.decode_attention_path() < path:
        pytest.skip(f"this CPU does not run decode attention path {path}")
    module = native if native.decode_attention_path() == path else variant("decode_attention", path)
    assert module.decode_attention_path() == path
    return module


@pytest.mark.parametrize("path", [2, 1, 0])
@pytest.mark.parametrize("heads,kvh,d", [(9, 3, 64), (8, 2, 64), (6, 2, 128), (4, 1, 128),
                                         (4, 4, 64), (8, 4, 128), (12, 2, 64), (14, 2, 64),
                                         (16, 2, 128), (4, 1, 256), (8, 4, 256), (2, 2, 256),
                                         (8, 1, 256)])
@pytest.mark.parametrize("window", [0, 40])
def test_bf16_paths_match_reference(path, heads, kvh, d, window):
    """Each bf16 path against the float64 reference, over lengths around its blocks: 16
    positions (scores), 32 (the AMX P V step), 64 (an AMX score round of four blocks) and
    several rounds, one request per length so that a thread runs several tasks (the AMX
    kernel asks for the next task's rows meanwhile); with a sliding window too. Groups of
    1, 2, 6, 7 and 8 and head_dim 256 (Gemma) take the AMX kernel on path 2 and the
    float32 block kernel else."""
    module = _bf16_kernel(path)
    lengths = [1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 128, 129, 300]
    q, k_buf, v_buf, r2t, rows, _ = _case(len(lengths), heads, kvh, d, torch.bfloat16, 300,
                                          seed=heads * d + window)
    lens = torch.tensor(lengths)
    out = module.paged_decode_attention(q, k_buf, v_buf, r2t, rows, lens, d ** -0.5, window)
    ref = _reference(q, k_buf, v_buf, r2t, rows, lens, d ** -0.5, window)
    torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("path", [2, 1])
@pytest.mark.parametrize("rising", [True, False])
def test_bf16_paths_steep_scores(path, rising):
    """Scores rising or falling steeply along the positions (a new max in every block, or
    none): the dp kernel rescales what it summed, the AMX kernel's max is the whole
    row's; scores far below the max get weight 0 and no NaN."""
    module = _bf16_kernel(path)
    d, n = 64, 150
    q, k_buf, v_buf, r2t, rows, lens = _case(2, 6, 2, d, torch.float32, n, seed=13)
    lens = torch.tensor([n, n - 5])
    ramp = torch.linspace(-3, 3, n) if rising else torch.linspace(3, -3, n)
    for i in range(2):
        slots = r2t[rows[i], :n].long()
        k_buf[slots] = ramp.view(n, 1, 1) * q[i, ::3].view(1, 2, d) * 0.6
    q, k_buf, v_buf = q.bfloat16(), k_buf.bfloat16(), v_buf.bfloat16()
    out = module.paged_decode_attention(q, k_buf, v_buf, r2t, rows, lens, d ** -0.5)
    ref = _reference(q, k_buf, v_buf, r2t, rows, lens, d ** -0.5)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("path", [2, 1])
def test_bf16_paths_read_only_the_requests_slots(path):
    """NaN in every K row and huge values in every V row outside the requests' positions
    change nothing (the zero rows past a request's end, not the pool's, fill its blocks)."""
    module = _bf16_kernel(path)
    q, k_buf, v_buf, r2t, rows, lens = _case(5, 9, 3, 64, torch.bfloat16, 70, seed=21)
    lens = torch.tensor([1, 17, 33, 64, 70])
    out = module.paged_decode_attention(q, k_buf, v_buf, r2t, rows, lens, 0.125)
    used = torch.zeros(k_buf.shape[0], dtype=torch.bool)
    for i in range(5):
        used[r2t[rows[i], :lens[i]].long()] = True
    k_buf[~used] = float("nan")
    v_buf[~used] = 1e30
    torch.testing.assert_close(module.paged_decode_attention(q, k_buf, v_buf, r2t, rows, lens, 0.125),
                               out, rtol=0, atol=0)


@pytest.mark.parametrize("path", [2, 1])
def test_bf16_paths_fused_write_equals_set_kv(path):
    """The fused write (the step's own K/V written, then attended) on the bf16 paths gives
    what writing the pool first and attending gives, and writes only loc."""
    module = _bf16_kernel(path)
    b, heads, kvh, d = 6, 8, 2, 128
    q, k_buf, v_buf, r2t, rows, lens = _case(b, heads, kvh, d, torch.bfloat16, 50, seed=31)
    loc = torch.stack([r2t[rows[i], lens[i] - 1] for i in range(b)]).long()
    g = torch.Generator().manual_seed(32)
    k = torch.randn(b, kvh, d, generator=g).bfloat16()
    v = torch.randn(b, kvh, d, generator=g).bfloat16()
    k_ref, v_ref = k_buf.clone(), v_buf.clone()
    k_ref[loc], v_ref[loc] = k, v
    ref = module.paged_decode_attention(q, k_ref, v_ref, r2t, rows, lens, d ** -0.5)
    out = module.paged_decode_attention(q, k_buf, v_buf, r2t, rows, lens, d ** -0.5, 0, k, v, loc)
    assert torch.equal(k_buf, k_ref) and torch.equal(v_buf, v_ref)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


# --- long requests: split into chunks of positions, merged (decode_attention.cpp) -------

SPLIT = 256  # kSplitPositions


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("heads,kvh,d", [(9, 3, 64), (4, 1, 256), (8, 2, 128), (6, 6, 32)])
def test_long_requests_split_match_reference(dtype, tol, heads, kvh, d):
    """Lengths at and past the split (one chunk, a chunk and one position, several chunks
    and a remainder) beside a short one, also under a sliding window that cuts a long
    request to a split of its own."""
    lens = torch.tensor([SPLIT - 1, SPLIT, SPLIT + 1, 3 * SPLIT + 77, 5])
    q, k_buf, v_buf, r2t, rows, _ = _case(5, heads, kvh, d, dtype, int(lens.max()), seed=d)
    for window in (0, SPLIT + 30):
        out = paged_decode_attention(q, k_buf, v_buf, r2t, rows, lens, d ** -0.5, window)
        ref = _reference(q, k_buf, v_buf, r2t, rows, lens, d ** -0.5, window)
        torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("rising", [True, False])
def test_split_merge_rescales(rising):
    """Scores rising (or falling) steeply over 3 chunks: each chunk's max differs, so the
    merge's rescaling of the chunks' sums decides the result."""
    d, n = 64, 3 * SPLIT - 10
    q, k_buf, v_buf, r2t, rows, lens = _case(1, 4, 2, d, torch.float32, n, seed=12)
    lens = torch.tensor([n])
    ramp = torch.linspace(-1, 1, n) if rising else torch.linspace(1, -1, n)
    slots = r2t[rows[0], :n].long()
    k_buf[slots] = ramp.view(n, 1, 1) * q[0, ::2].view(1, 2, d) * 0.6
    out = paged_decode_attention(q, k_buf, v_buf, r2t, rows, lens, d ** -0.5)
    ref = _reference(q, k_buf, v_buf, r2t, rows, lens, d ** -0.5)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_split_rows_equal_alone_and_in_a_batch():
    """The split depends on a request's length alone: each row's output is the same bit
    for bit computed alone or beside others (a verify's rows equal their decode steps)."""
    lens = torch.tensor([2 * SPLIT + 3, 40, SPLIT + 1, 700])
    q, k_buf, v_buf, r2t, rows, _ = _case(4, 9, 3, 64, torch.float32, 700, seed=13)
    whole = paged_decode_attention(q, k_buf, v_buf, r2t, rows, lens, 0.125)
    for i in range(4):
        alone = paged_decode_attention(q[i:i + 1], k_buf, v_buf, r2t, rows[i:i + 1],
                                       lens[i:i + 1], 0.125)
        assert torch.equal(alone, whole[i:i + 1])


def test_split_fused_write_equals_set_kv_then_attention():
    """The step's own K/V row (position L - 1, in the last chunk) is written before that
    chunk reads it, and only there."""
    b, heads, kvh, d = 3, 6, 2, 64
    q, k_buf, v_buf, r2t, rows, _ = _case(b, heads, kvh, d, torch.float32, 600, seed=14)
    lens = torch.tensor([600, SPLIT + 1, 9])
    loc = torch.stack([r2t[rows[i], lens[i] - 1] for i in range(b)]).long()
    g = torch.Generator().manual_seed(15)
    k, v = torch.randn(b, kvh, d, generator=g), torch.randn(b, kvh, d, generator=g)
    k_ref, v_ref = k_buf.clone(), v_buf.clone()
    k_ref[loc], v_ref[loc] = k, v
    ref = paged_decode_attention(q, k_ref, v_ref, r2t, rows, lens, 0.125)
    out = decode_attention_with_kv_write(q, k, v, k_buf, v_buf, loc, r2t, rows, lens, 0.125)
    assert torch.equal(k_buf, k_ref) and torch.equal(v_buf, v_ref)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
