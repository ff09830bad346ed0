"""Checks shared by the engine tests."""

from __future__ import annotations

import random

from radixlm.sampling_params import SamplingParams


def assert_all_slots_back(engine, total: int | None = None) -> None:
    """Idle engine: the pool invariant holds and every KV slot is free or an unlocked
    (evictable) radix cache entry; `total` defaults to the pool size. A batch still in
    flight (overlap scheduling) that holds only answered requests is settled first."""
    engine.settle()
    sched = engine.scheduler
    assert not sched.has_work()
    engine.check_invariant()
    cache = sched.tree_cache
    assert cache.protected_size() == 0
    alloc = sched.runner.allocator
    assert alloc.available_size() + cache.evictable_size() == (alloc.size if total is None else total)


def run_staggered(engine, ps: list[list[int]],
                  params: list[SamplingParams] | SamplingParams, seed: int = 0) -> list[list[int]]:
    """Submit the prompts a few steps apart; check the pool invariant after every step."""
    if isinstance(params, SamplingParams):
        params = [params] * len(ps)
    rng = random.Random(seed)
    rids = []
    for p, sp in zip(ps, params):
        rids.append(engine.submit(p, sp))
        for _ in range(rng.randrange(0, 4)):
            engine.step()
            engine.check_invariant()
    while not all(engine.result(r)["finished"] for r in rids):
        engine.step()
        engine.check_invariant()
    engine.settle()
    return [engine.pop_result(r)["output_ids"] for r in rids]
