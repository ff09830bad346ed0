import pytest
import torch

from radixlm.mem import (KVSlotAllocator, PoolInvariantError, ReqToTokenPool, TokenToKVPool,
                         check_pool_invariant)


def test_allocator_never_hands_out_dummy_slot_and_roundtrips():
    alloc = KVSlotAllocator(10)
    a = alloc.alloc(4)
    b = alloc.alloc(6)
    assert alloc.alloc(1) is None
    got = torch.cat([a, b])
    assert sorted(got.tolist()) == list(range(1, 11))  # slot 0 is the dummy
    alloc.free(a)
    assert alloc.available_size() == 4
    check_pool_invariant(alloc, held_by_requests=6)
    alloc.free(b)
    check_pool_invariant(alloc, held_by_requests=0)


def test_alloc_too_many_takes_nothing():
    alloc = KVSlotAllocator(3)
    assert alloc.alloc(4) is None
    assert alloc.available_size() == 3


def test_invariant_detects_leak_and_double_free():
    alloc = KVSlotAllocator(8)
    s = alloc.alloc(3)
    with pytest.raises(PoolInvariantError):
        check_pool_invariant(alloc, held_by_requests=0)
    alloc.free(s)
    alloc.free(s[:1])  # double free
    with pytest.raises(PoolInvariantError):
        check_pool_invariant(alloc, held_by_requests=-1)


def test_req_to_token_rows_and_writes():
    pool = ReqToTokenPool(size=2, max_context_len=8)
    r0, r1 = pool.alloc(), pool.alloc()
    assert pool.alloc() is None
    pool.write(r0, 2, torch.tensor([5, 6, 7]))
    assert pool.req_to_token[r0, 2:5].tolist() == [5, 6, 7]
    assert pool.req_to_token.dtype == torch.int32
    pool.free(r0)
    assert pool.available_size() == 1
    with pytest.raises(AssertionError):
        pool.free(r0)
    pool.free(r1)


def test_token_to_kv_pool_shapes_and_set():
    pool = TokenToKVPool(size=4, num_layers=2, kv_heads=3, head_dim=8, dtype=torch.float32)
    assert pool.k_buffers[0].shape == (5, 3, 8)  # +1 for the dummy slot 0
    k = torch.randn(2, 3, 8)
    v = torch.randn(2, 3, 8)
    pool.set_kv(1, torch.tensor([1, 4]), k, v)
    kb, vb = pool.get_kv(1)
    assert torch.equal(kb[[1, 4]], k) and torch.equal(vb[[1, 4]], v)
    assert TokenToKVPool.bytes_per_token(30, 3, 64, torch.float32) == 2 * 30 * 3 * 64 * 4
