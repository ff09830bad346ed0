"""RouterArgs: every tunable of `radixlm router`, one frozen dataclass (fields become
flags through `radixlm.config.add_cli_args`, like ServerArgs). The worker URLs are a
separate positional-like flag (`--worker-urls URL [URL ...]`), see `radixlm/router/cli.py`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from radixlm.config import _opt
from radixlm.router.cache_aware import CacheAwareConfig
from radixlm.router.policy import POLICY_NAMES


@dataclass(frozen=True)
class RouterArgs:
    host: str = _opt("127.0.0.1", "HTTP host of the router.")
    port: int = _opt(30000, "HTTP port of the router.")
    policy: str = _opt("cache_aware", "How a request picks its worker: cache_aware (longest "
                       "prefix match unless load is imbalanced), round_robin, random, "
                       "power_of_two (less loaded of two random workers).", POLICY_NAMES)
    cache_threshold: float = _opt(
        0.5, "cache_aware: minimum matched fraction of the request text for routing by "
        "cache; below it the request goes to the least loaded worker.")
    balance_abs_threshold: int = _opt(
        32, "cache_aware: load (requests in flight) is imbalanced when max - min exceeds "
        "this AND max exceeds --balance-rel-threshold * min; then the least loaded wins.")
    balance_rel_threshold: float = _opt(1.5, "cache_aware: see --balance-abs-threshold.")
    max_tree_size: int = _opt(1 << 24, "cache_aware: characters kept per worker tree; "
                              "least recently used prefixes are evicted beyond it.")
    eviction_interval_s: float = _opt(60.0, "cache_aware: seconds between tree evictions.")
    health_check_interval_s: float = _opt(5.0, "Seconds between health checks of each worker.")
    health_check_timeout_s: float = _opt(5.0, "Timeout of one health check.")
    health_failure_threshold: int = _opt(
        2, "Failed health checks in a row that take a worker out of rotation (a refused "
        "connection during a request takes it out at once).")
    health_success_threshold: int = _opt(1, "Passed health checks in a row that bring a "
                                         "worker back.")
    max_retries: int = _opt(2, "Retries of a non-streaming request (or of a stream before "
                            "its first byte) on another worker after a connection failure "
                            "or a 5xx.")
    request_timeout_s: float = _opt(1800.0, "Timeout of one proxied request (also the "
                                    "longest pause allowed between two streamed chunks).")
    random_seed: int | None = _opt(None, "Seed of the random and power_of_two policies.")
    api_key: str | None = _opt(
        None, "If set, every endpoint but /health needs 'Authorization: Bearer <key>' "
        "(the proxied requests forward it to the workers, which may check their own).")
    response_affinity_size: int = _opt(
        1 << 16, "Stored Responses API ids whose worker the router remembers (least "
        "recently used forgotten first); an id it does not know is looked for on every "
        "healthy worker.")
    log_level: str = _opt("info", "Logging level.", ["debug", "info", "warning", "error"])

    def cache_aware_config(self) -> CacheAwareConfig:
        return CacheAwareConfig(self.cache_threshold, self.balance_abs_threshold,
                                self.balance_rel_threshold, self.max_tree_size)

    def replace(self, **changes: object) -> "RouterArgs":
        return dataclasses.replace(self, **changes)
