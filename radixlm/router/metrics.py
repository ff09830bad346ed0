"""Prometheus metrics of the router, on a registry of its own (never the global one, so
two routers in one process -- tests -- do not collide)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_RATIO_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)


@dataclass
class RouterMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.worker_load = Gauge("radixlm_router_worker_load",
                                 "Requests in flight on a worker through this router.",
                                 ["worker"], registry=r)
        self.worker_healthy = Gauge("radixlm_router_worker_healthy",
                                    "1 when the worker is in rotation, 0 when out.",
                                    ["worker"], registry=r)
        self.routed = Counter("radixlm_router_requests_routed",
                              "Requests routed, by policy and decision (cache_hit, "
                              "cache_miss, imbalance, round_robin, random, power_of_two).",
                              ["policy", "decision", "worker"], registry=r)
        self.match_ratio = Histogram("radixlm_router_cache_match_ratio",
                                     "cache_aware: matched fraction of each routed "
                                     "request's text on the best worker.",
                                     buckets=_RATIO_BUCKETS, registry=r)
        self.responses = Counter("radixlm_router_responses",
                                 "Proxied requests by endpoint and final status.",
                                 ["endpoint", "status"], registry=r)
        self.retries = Counter("radixlm_router_retries",
                               "Requests re-sent to another worker.", registry=r)
        self.worker_errors = Counter("radixlm_router_worker_errors",
                                     "Connection failures and 5xx answers, by worker.",
                                     ["worker"], registry=r)
        self.stream_errors = Counter("radixlm_router_stream_errors",
                                     "Streams cut by their worker mid-way.", registry=r)
        self.overloaded = Counter("radixlm_router_overloaded",
                                  "429 answers of workers whose queue was full (the request "
                                  "went to another worker when one was left).", registry=r)

    def set_worker(self, url: str, healthy: bool, load: int) -> None:
        self.worker_healthy.labels(url).set(1 if healthy else 0)
        self.worker_load.labels(url).set(load)

    def drop_worker(self, url: str) -> None:
        for g in (self.worker_load, self.worker_healthy):
            try:
                g.remove(url)
            except KeyError:
                pass

    def render(self) -> bytes:
        return generate_latest(self.registry)
