"""Routing policies without HTTP: affinity, imbalance override, miss placement, eviction,
the simple policies, and load release through LoadGuard on every path."""

from __future__ import annotations

import asyncio

import pytest

from radixlm.router.cache_aware import CacheAwareConfig, CacheAwarePolicy
from radixlm.router.policy import PowerOfTwoPolicy, RandomPolicy, RoundRobinPolicy
from radixlm.router.request_text import routing_text
from radixlm.router.workers import WorkerRegistry, normalize_url

A, B, C = "http://a:1", "http://b:1", "http://c:1"
PREFIX = "You are a helpful assistant. Here is a long shared document. " * 4


def _registry(*urls: str) -> WorkerRegistry:
    return WorkerRegistry(list(urls))


def _policy(**kw: object) -> CacheAwarePolicy:
    return CacheAwarePolicy(CacheAwareConfig(**kw))  # type: ignore[arg-type]


def test_requests_sharing_a_prefix_stick_to_one_worker() -> None:
    reg = _registry(A, B)
    pol = _policy(cache_threshold=0.5)
    first = pol.select(PREFIX + "question 0", reg.healthy())
    assert first.reason == "cache_miss"
    for i in range(1, 6):
        d = pol.select(PREFIX + f"question {i}", reg.healthy())
        assert d.worker is first.worker and d.reason == "cache_hit"
        assert d.match_ratio is not None and d.match_ratio > 0.9


def test_miss_goes_to_least_loaded_worker() -> None:
    reg = _registry(A, B, C)
    reg.get(A).load, reg.get(B).load, reg.get(C).load = 3, 1, 2
    d = _policy().select("a brand new prompt", reg.healthy())
    assert d.reason == "cache_miss" and d.worker.url == B


def test_miss_with_equal_loads_goes_to_smaller_tree_then_order() -> None:
    reg = _registry(A, B)
    pol = _policy(cache_threshold=0.9)
    pol.tree(A).insert("abcdef")
    pol.tree(B).insert("xyz")
    d = pol.select("abcdefghijklmnopqrstuvwxyz", reg.healthy())  # ratio 6/26: a miss
    assert d.reason == "cache_miss" and d.worker.url == B  # B's tree is smaller
    d = _policy().select("zzz", reg.healthy())
    assert d.worker.url == A  # all equal: registry order


def test_sequential_new_groups_alternate_workers() -> None:
    reg = _registry(A, B)
    pol = _policy()
    owners = [pol.select(f"group {g} " + "ctx " * 20, reg.healthy()).worker.url
              for g in range(4)]
    assert owners == [A, B, A, B]


def test_different_groups_spread_over_workers() -> None:
    reg = _registry(A, B)
    pol = _policy()
    owners = {}
    for g in range(4):
        text = f"group {g}: " + "context " * 20
        d = pol.select(text, reg.healthy())
        reg.guard(d.worker).acquire()  # requests stay in flight: misses balance by load
        owners[g] = d.worker.url
    assert sorted(owners.values()) == [A, A, B, B]


def test_cache_hit_ties_broken_by_load() -> None:
    reg = _registry(A, B)
    pol = _policy()
    pol.tree(A).insert(PREFIX)
    pol.tree(B).insert(PREFIX)
    reg.get(A).load = 2
    d = pol.select(PREFIX + "more", reg.healthy())
    assert d.reason == "cache_hit" and d.worker.url == B


def test_imbalance_overrides_cache_affinity() -> None:
    reg = _registry(A, B)
    pol = _policy(balance_abs_threshold=4, balance_rel_threshold=1.5)
    pol.tree(A).insert(PREFIX)
    reg.get(A).load, reg.get(B).load = 5, 0  # diff 5 > 4 and 5 > 1.5 * 0
    d = pol.select(PREFIX + "q", reg.healthy())
    assert d.reason == "imbalance" and d.worker.url == B
    # The text now lives in B's tree too.
    assert pol.tree(B).match(PREFIX + "q") == len(PREFIX + "q")


def test_imbalance_needs_both_thresholds() -> None:
    reg = _registry(A, B)
    pol = _policy(balance_abs_threshold=4, balance_rel_threshold=1.5)
    pol.tree(A).insert(PREFIX)
    reg.get(A).load, reg.get(B).load = 20, 15  # diff 5 > 4, but 20 < 1.5 * 15
    assert pol.select(PREFIX, reg.healthy()).worker.url == A
    reg.get(A).load, reg.get(B).load = 4, 0  # ratio unbounded, but diff 4 is not > 4
    assert pol.select(PREFIX, reg.healthy()).worker.url == A
    assert pol.is_imbalanced(reg.healthy()) is False


def test_eviction_keeps_trees_bounded_and_forgets_old_prefixes() -> None:
    reg = _registry(A)
    pol = _policy(max_tree_size=100)
    pol.select("old " + "x" * 80, reg.healthy())
    pol.select("new " + "y" * 80, reg.healthy())
    assert pol.tree_sizes()[A] > 100
    pol.evict()
    assert pol.tree_sizes()[A] <= 100
    assert pol.tree(A).match("old " + "x" * 80) == 0
    assert pol.tree(A).match("new " + "y" * 80) == 84


def test_forget_worker_drops_its_tree() -> None:
    reg = _registry(A, B)
    pol = _policy()
    reg.on_unavailable.append(pol.forget_worker)
    d = pol.select(PREFIX, reg.healthy())
    reg.set_healthy(d.worker.url, False)
    assert d.worker.url not in pol.tree_sizes()
    other = pol.select(PREFIX, reg.healthy())
    assert other.worker is not d.worker


def test_round_robin_random_power_of_two() -> None:
    reg = _registry(A, B, C)
    rr = RoundRobinPolicy()
    assert [rr.select("", reg.healthy()).worker.url for _ in range(4)] == [A, B, C, A]
    rnd = RandomPolicy(seed=1)
    seen = {rnd.select("", reg.healthy()).worker.url for _ in range(50)}
    assert seen == {A, B, C}
    reg.get(A).load, reg.get(B).load, reg.get(C).load = 5, 0, 5
    p2 = PowerOfTwoPolicy(seed=0)
    picks = [p2.select("", reg.healthy()).worker.url for _ in range(60)]
    # B is the least loaded: it wins every pair it is in (2 of 3 pairs); A and C never
    # beat it, so B gets about two thirds.
    assert 25 < picks.count(B) < 55
    assert PowerOfTwoPolicy(seed=0).select("", [reg.get(A)]).worker.url == A


def test_load_guard_releases_on_every_path() -> None:
    reg = _registry(A)
    w = reg.get(A)
    with reg.guard(w):
        assert w.load == 1
    assert w.load == 0
    with pytest.raises(RuntimeError):
        with reg.guard(w):
            raise RuntimeError("worker error")
    assert w.load == 0

    async def cancelled() -> None:
        async with reg.guard(w):
            await asyncio.sleep(10)  # the client hangs up: the task is cancelled

    async def main() -> None:
        task = asyncio.create_task(cancelled())
        await asyncio.sleep(0.01)
        assert w.load == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert w.load == 0
    g = reg.guard(w).acquire()
    g.release()
    g.release()  # idempotent
    assert w.load == 0


def test_guard_of_removed_and_readded_worker_does_not_touch_new_one() -> None:
    reg = _registry(A)
    old = reg.get(A)
    g = reg.guard(old).acquire()
    reg.remove(A)
    new = reg.add(A)
    g.release()
    assert new.load == 0 and old.load == 0


def test_routing_text() -> None:
    assert routing_text("/v1/completions", {"prompt": "hi"}) == "hi"
    assert routing_text("/v1/completions", {"prompt": ["a", "b"]}) == "a"
    assert routing_text("/v1/completions", {"prompt": [1, 2, 3]}) == "1 2 3"
    assert routing_text("/v1/completions", {"prompt": [[4, 5]]}) == "4 5"
    chat = {"messages": [{"role": "system", "content": "S"},
                         {"role": "user", "content": [{"type": "text", "text": "U"}]}]}
    text = routing_text("/v1/chat/completions", chat)
    assert text.startswith("<system>S") and text.endswith("<user>U\n")
    longer = routing_text("/v1/chat/completions",
                          {"messages": chat["messages"] + [{"role": "user", "content": "x"}]})
    assert longer.startswith(text)  # a continued conversation extends its prefix
    assert routing_text("/generate", {"text": "t"}) == "t"
    assert routing_text("/generate", {"input_ids": [7, 8]}) == "7 8"
    assert routing_text("/v1/completions", None) == ""
    assert normalize_url("127.0.0.1:5/") == "http://127.0.0.1:5"
