"""cache_aware: send a request where its prefix was sent before, unless load is uneven.

More: docs/router.md, "router/cache_aware.py".
"""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.router.approx_tree import ApproxRadixTree
from radixlm.router.policy import Decision, RoutingPolicy, least_loaded
from radixlm.router.workers import Worker


@dataclass(frozen=True)
class CacheAwareConfig:
    cache_threshold: float = 0.5
    balance_abs_threshold: int = 32
    balance_rel_threshold: float = 1.5
    max_tree_size: int = 1 << 24  # characters per worker tree


class CacheAwarePolicy(RoutingPolicy):
    name = "cache_aware"

    def __init__(self, config: CacheAwareConfig | None = None) -> None:
        self.config = config or CacheAwareConfig()
        self._trees: dict[str, ApproxRadixTree] = {}

    def tree(self, url: str) -> ApproxRadixTree:
        tree = self._trees.get(url)
        if tree is None:
            tree = self._trees[url] = ApproxRadixTree()
        return tree

    def is_imbalanced(self, workers: list[Worker]) -> bool:
        loads = [w.load for w in workers]
        hi, lo = max(loads), min(loads)
        c = self.config
        return hi - lo > c.balance_abs_threshold and hi > c.balance_rel_threshold * lo

    def select(self, text: str, workers: list[Worker]) -> Decision:
        if self.is_imbalanced(workers):
            decision = Decision(least_loaded(workers), "imbalance")
        else:
            # Scoring must not refresh LRU ages of trees that do not get the request.
            matches = [self.tree(w.url).match(text, touch=False) for w in workers]
            best = max(matches)
            ratio = best / len(text) if text else 0.0
            if text and ratio >= self.config.cache_threshold:
                # min over (load, registry position) among the longest matches
                i = min((i for i, m in enumerate(matches) if m == best),
                        key=lambda i: workers[i].load)
                decision = Decision(workers[i], "cache_hit", ratio)
            else:
                i = min(range(len(workers)), key=lambda i: (
                    workers[i].load, self.tree(workers[i].url).size))
                decision = Decision(workers[i], "cache_miss", ratio)
        self.tree(decision.worker.url).insert(text)
        return decision

    def forget_worker(self, url: str) -> None:
        self._trees.pop(url, None)

    def evict(self) -> None:
        for tree in self._trees.values():
            tree.evict(self.config.max_tree_size)

    def tree_sizes(self) -> dict[str, int]:
        return {url: tree.size for url, tree in self._trees.items()}
