"""The pool invariant: every KV slot is free, or held by exactly one owner.

free slots + slots held by the radix cache + slots held by running requests = total.
Checked by tests after every run and by the scheduler whenever it goes idle.
"""

from __future__ import annotations

import torch

from radixlm.mem.kv_slot_allocator import KVSlotAllocator


class PoolInvariantError(AssertionError):
    pass


def check_pool_invariant(allocator: KVSlotAllocator, held_by_requests: int,
                         held_by_cache: int = 0, check_unique: bool = True) -> None:
    free = allocator.available_size()
    total = allocator.size
    if free + held_by_requests + held_by_cache != total:
        raise PoolInvariantError(
            f"KV pool leak: free {free} + held by requests {held_by_requests} + "
            f"held by cache {held_by_cache} != total {total}")
    if check_unique and free:
        slots = allocator.free_slots
        if int(slots.min()) < 1 or int(slots.max()) > total or torch.unique(slots).numel() != free:
            raise PoolInvariantError("KV free list holds duplicates or out-of-range slots")
