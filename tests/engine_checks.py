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


def random_prompts(n: int, seed: int, lo: int = 5, hi: int = 60,
                   shared: int = 0) -> list[list[int]]:
    """Random prompts of lo..hi-1 tokens (ids 3..255); the first `shared` tokens are common
    to all (radix cache hits)."""
    rng = random.Random(seed)
    head = [rng.randrange(3, 256) for _ in range(shared)]
    return [head + [rng.randrange(3, 256) for _ in range(rng.randrange(lo, hi))]
            for _ in range(n)]


def mixed_params(n: int, seed: int, max_new: int = 40,
                 greedy_presence: float = 0.4) -> list[SamplingParams]:
    """Every third request greedy (with a presence penalty of `greedy_presence`), seeded
    top-p, or seeded top-k with penalties and logprobs; 1..max_new-1 tokens each."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kw = dict(max_new_tokens=rng.randrange(1, max_new), ignore_eos=True)
        if i % 3 == 1:
            kw.update(temperature=0.9, top_p=0.9, seed=1000 + i)
        elif i % 3 == 2:
            kw.update(temperature=1.2, top_k=20, seed=2000 + i, frequency_penalty=0.5,
                      repetition_penalty=1.3, logprobs=True, top_logprobs=2)
        else:
            kw.update(temperature=0.0, presence_penalty=greedy_presence)
        out.append(SamplingParams(**kw))
    return out
