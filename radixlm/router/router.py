"""Router: the state one router process holds -- workers, policy, metrics, HTTP client --
and the decisions that change it (pick a worker, react to a failing worker).

Everything runs on one asyncio event loop, so no locks: a `select` and the `LoadGuard`
acquire that follows it happen without an `await` in between.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import httpx

from radixlm.router.cache_aware import CacheAwarePolicy
from radixlm.router.config import RouterArgs
from radixlm.router.response_affinity import ResponseAffinity
from radixlm.router.routing_log import RoutingLog
from radixlm.router.metrics import RouterMetrics
from radixlm.router.policy import (Decision, PowerOfTwoPolicy, RandomPolicy, RoundRobinPolicy,
                                   RoutingPolicy)
from radixlm.router.workers import Worker, WorkerRegistry

logger = logging.getLogger(__name__)


def make_policy(args: RouterArgs) -> RoutingPolicy:
    if args.policy == "cache_aware":
        return CacheAwarePolicy(args.cache_aware_config())
    if args.policy == "round_robin":
        return RoundRobinPolicy()
    if args.policy == "random":
        return RandomPolicy(args.random_seed)
    if args.policy == "power_of_two":
        return PowerOfTwoPolicy(args.random_seed)
    raise ValueError(f"unknown policy {args.policy!r}")


@dataclass
class Router:
    args: RouterArgs
    registry: WorkerRegistry
    policy: RoutingPolicy
    metrics: RouterMetrics = field(default_factory=RouterMetrics)
    client: httpx.AsyncClient | None = None  # set by the app's lifespan
    # The last routing decisions, for GET /dashboard (router/dashboard.py).
    routing_log: RoutingLog = field(default_factory=RoutingLog)
    exiting: bool = False  # set when the router shuts down: dashboard streams end
    # Stored Responses API ids -> the worker holding each (router/responses.py).
    responses: ResponseAffinity = field(init=False)

    def __post_init__(self) -> None:
        self.responses = ResponseAffinity(self.args.response_affinity_size)

    @classmethod
    def create(cls, args: RouterArgs, worker_urls: list[str]) -> "Router":
        router = cls(args, WorkerRegistry(worker_urls), make_policy(args))
        router.registry.on_unavailable.append(router.policy.forget_worker)
        return router

    def http(self) -> httpx.AsyncClient:
        assert self.client is not None, "the router's HTTP client starts with the app"
        return self.client

    def select(self, text: str | None, exclude: set[str] = frozenset()) -> Decision | None:
        """Pick a healthy worker not in `exclude` (URLs already tried); None if none is left.
        `text` None (a request any worker answers alike, e.g. /v1/models): the first
        candidate, not the policy. Counts policy decisions in the metrics."""
        candidates = [w for w in self.registry.healthy() if w.url not in exclude]
        if not candidates:
            return None
        if text is None:
            return Decision(candidates[0], "first_healthy")
        decision = self.policy.select(text, candidates)
        self.routing_log.record(decision, len(text), candidates)
        self.metrics.routed.labels(self.policy.name, decision.reason, decision.worker.url).inc()
        if decision.match_ratio is not None:
            self.metrics.match_ratio.observe(decision.match_ratio)
        return decision

    def worker_failed(self, worker: Worker, error: str, take_out: bool) -> None:
        """A request to `worker` failed. `take_out`: the worker cannot be reached at all
        (connection refused/reset before an answer), so it leaves the rotation now instead
        of at the next health checks; the health checker brings it back."""
        self.metrics.worker_errors.labels(worker.url).inc()
        if take_out and self.registry.set_healthy(worker.url, False):
            logger.warning("worker %s taken out of rotation: %s", worker.url, error)
        else:
            logger.warning("worker %s failed a request: %s", worker.url, error)

    def refresh_worker_metrics(self) -> None:
        for w in self.registry.all():
            self.metrics.set_worker(w.url, w.healthy, w.load)
