"""`RadixRequestRouter`: Ray Serve's request router for radixlm replicas, choosing with the
same `CacheAwarePolicy` (router/cache_aware.py) that `radixlm router` runs: one policy,
two hosts.

Each candidate replica is a router `Worker` whose url is the replica id and whose load is
the number of requests Serve counts at it (its queue-length cache, which Serve keeps from
probes and sends), else the engine's running + waiting from its routing stats. The policy
picks one by the request's routing text (`RoutedRequest.prompt`); the others follow as a
second rank, tried when the first is full. The policy's tree for a replica is forgotten
when the replica goes (died, scaled down), when its engine is new (`engine_id`), and when
its engine's cache emptied (`cached_tokens` fell to 0). `decisions` counts the reasons.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ray.serve.request_router import (
    PendingRequest, ReplicaID, RequestRouter, RunningReplica,
)

from radixlm.router.cache_aware import CacheAwareConfig, CacheAwarePolicy
from radixlm.router.workers import Worker

EVICT_EVERY = 1024  # decisions between two trims of the policy's trees


def request_text(pending: PendingRequest | None) -> str:
    if pending is None:
        return ""
    for arg in pending.args:
        text = getattr(arg, "prompt", None)
        if isinstance(text, str):
            return text
    return ""


class RadixRequestRouter(RequestRouter):
    def initialize_state(self, **config: Any) -> None:
        """`config`: CacheAwareConfig fields (cache_threshold, balance_abs_threshold, ...)."""
        self.policy = CacheAwarePolicy(CacheAwareConfig(**config))
        self.decisions: Counter[str] = Counter()
        self._engine: dict[str, tuple[str | None, int]] = {}  # engine_id, cached_tokens

    def _load(self, replica: RunningReplica) -> int:
        queued = self.replica_queue_len_cache.get(replica.replica_id)
        if queued is not None:
            return queued
        stats = replica.routing_stats or {}
        return int(stats.get("running", 0)) + int(stats.get("waiting", 0))

    def _sync_engine(self, replica: RunningReplica) -> None:
        stats = replica.routing_stats or {}
        key = replica.replica_id.unique_id
        engine_id, cached = stats.get("engine_id"), int(stats.get("cached_tokens", 0))
        before = self._engine.get(key)
        if before is not None and (before[0] != engine_id or (before[1] > 0 and cached == 0)):
            self.policy.forget_worker(key)
        self._engine[key] = (engine_id, cached)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None,
                              ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        workers = []
        for r in candidate_replicas:
            self._sync_engine(r)
            workers.append(Worker(r.replica_id.unique_id, load=self._load(r)))
        decision = self.policy.select(request_text(pending_request), workers)
        self.decisions[decision.reason] += 1
        if self.decisions.total() % EVICT_EVERY == 0:
            self.policy.evict()
        chosen = by_id[decision.worker.url]
        rest = [r for r in candidate_replicas if r is not chosen]
        return [[chosen], rest] if rest else [[chosen]]

    def _forget(self, replica_id: ReplicaID) -> None:
        self.policy.forget_worker(replica_id.unique_id)
        self._engine.pop(replica_id.unique_id, None)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._forget(replica_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        gone = set(self._replicas) - {r.replica_id for r in replicas}
        super().update_replicas(replicas)
        for replica_id in gone:
            self._forget(replica_id)
