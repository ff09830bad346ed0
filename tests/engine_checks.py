"""Checks shared by the engine tests."""

from __future__ import annotations


def assert_all_slots_back(engine, total: int | None = None) -> None:
    """Idle engine: the pool invariant holds and every KV slot is free or an unlocked
    (evictable) radix cache entry; `total` defaults to the pool size."""
    sched = engine.scheduler
    assert not sched.has_work()
    engine.check_invariant()
    cache = sched.tree_cache
    assert cache.protected_size() == 0
    alloc = sched.runner.allocator
    assert alloc.available_size() + cache.evictable_size() == (alloc.size if total is None else total)
