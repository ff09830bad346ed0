"""Device memory: the request -> token -> KV addressing chain and its allocators."""

from radixlm.mem.kv_slot_allocator import KVSlotAllocator
from radixlm.mem.req_to_token_pool import ReqToTokenPool
from radixlm.mem.token_to_kv_pool import TokenToKVPool
from radixlm.mem.invariant import PoolInvariantError, check_pool_invariant

__all__ = ["KVSlotAllocator", "ReqToTokenPool", "TokenToKVPool", "PoolInvariantError",
           "check_pool_invariant"]
