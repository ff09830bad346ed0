"""Routing policies: pure choosers of a worker, with no HTTP.

`RoutingPolicy.select(text, workers)` picks one of `workers` (healthy, non-empty, in
registry order) for a request whose routing text is `text` and returns a `Decision` whose
`reason` labels the metrics. Policies read `Worker.load` (requests in flight) but never
change it: the proxy holds a `LoadGuard` around the request. A name registry maps
`--policy` to a constructor; `cache_aware` lives in its own module.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass

from radixlm.router.workers import Worker


@dataclass(frozen=True)
class Decision:
    worker: Worker
    # cache_hit | cache_miss | imbalance (cache_aware), round_robin, random, power_of_two;
    # first_healthy for requests routed without the policy (Router.select)
    reason: str
    # cache_aware: longest match / len(text) over the workers it compared; else None.
    match_ratio: float | None = None


class RoutingPolicy(ABC):
    name: str = ""

    @abstractmethod
    def select(self, text: str, workers: list[Worker]) -> Decision:
        """Choose one of `workers` (non-empty). May update the policy's own state (e.g. the
        cache_aware trees), never the workers."""

    def forget_worker(self, url: str) -> None:
        """The worker left or went down: drop any state kept for it."""

    def evict(self) -> None:
        """Periodic housekeeping (cache_aware: trim the trees)."""


def least_loaded(workers: list[Worker]) -> Worker:
    """The worker with the fewest requests in flight; the first one on ties."""
    return min(workers, key=lambda w: w.load)


class RoundRobinPolicy(RoutingPolicy):
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0  # monotonically increasing; taken modulo the current worker count

    def select(self, text: str, workers: list[Worker]) -> Decision:
        worker = workers[self._next % len(workers)]
        self._next += 1
        return Decision(worker, "round_robin")


class RandomPolicy(RoutingPolicy):
    name = "random"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def select(self, text: str, workers: list[Worker]) -> Decision:
        return Decision(self._rng.choice(workers), "random")


class PowerOfTwoPolicy(RoutingPolicy):
    """Sample two distinct workers at random, take the less loaded (the first on ties)."""

    name = "power_of_two"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def select(self, text: str, workers: list[Worker]) -> Decision:
        if len(workers) == 1:
            return Decision(workers[0], "power_of_two")
        a, b = self._rng.sample(workers, 2)
        return Decision(b if b.load < a.load else a, "power_of_two")


POLICY_NAMES = ["cache_aware", "round_robin", "random", "power_of_two"]
