"""RayServeArgs: the flags of `radixlm serve-ray` beyond `radixlm serve`'s engine flags
(replicas, their resources, the request router). No Ray import: the CLI builds its parser
without Ray installed."""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.config import _opt

REQUEST_ROUTERS = ["cache_aware", "power_of_two", "prefix_cache_affinity"]


@dataclass(frozen=True)
class RayServeArgs:
    num_replicas: int = _opt(1, "Engine replicas (each one radixlm engine).")
    num_cpus_per_replica: float = _opt(1.0, "CPUs Ray reserves for each replica (per TP "
                                       "node with --nnodes); a CPU engine computes with "
                                       "that many threads (floored, shared by the node's "
                                       "TP ranks) unless --num-threads is given.")
    num_gpus_per_replica: float = _opt(0.0, "GPUs Ray reserves for each replica (per TP "
                                       "node with --nnodes; set it to --tp-size / --nnodes).")
    request_router: str = _opt("cache_aware", "Serve request router of the replicas: "
                               "cache_aware (radixlm's policy), power_of_two (Ray's "
                               "default), prefix_cache_affinity (Ray Serve LLM's).",
                               REQUEST_ROUTERS)
    max_ongoing_requests: int = _opt(256, "Requests Serve sends to one replica at once "
                                     "(the engine queues beyond its running batch).")
    routing_stats_period_s: float = _opt(1.0, "How often each replica reports its routing "
                                         "stats (queue, running, KV use, cache).")
    engine_log_dir: str | None = _opt(None, "Write each engine's log to "
                                      "DIR/engine-<replica>.log (default: discarded).")
    ray_address: str | None = _opt(None, "Ray cluster to join (default: auto, else a new "
                                   "local one). serve-ray only.")
    route_prefix: str = _opt("/", "HTTP path the application is served under.")
    app_name: str = _opt("radixlm", "Serve application name.")
