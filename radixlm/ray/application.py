"""The Ray Serve application: `build_app(RayServeArgs, ServerArgs)` -> Ingress bound to
`num_replicas` EngineReplicas, each engine started with the ServerArgs of `radixlm serve`.

`request_router` picks the Serve request router of the replicas: cache_aware (radixlm's
policy, request_router.py), power_of_two (Ray's default), prefix_cache_affinity (Ray Serve
LLM's PrefixCacheAffinityRouter, for comparison). Each replica takes
`num_cpus_per_replica` / `num_gpus_per_replica`; with `--nnodes N` (TP over Ray nodes) it
reserves a placement group of N bundles of those, the replica in bundle 0, the other TP
nodes' ranks in bundles 1..N-1 (tp_placement.py), spread over nodes. A CPU replica's
engine computes with the CPUs it reserves (`engine_server_args`), not the whole node's.
"""

from __future__ import annotations

import math
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig

from radixlm.config import ServerArgs
from radixlm.ray.config import REQUEST_ROUTERS, RayServeArgs
from radixlm.ray.ingress import Ingress
from radixlm.ray.replica import EngineReplica
from radixlm.ray.request_router import RadixRequestRouter

def router_config(name: str, period_s: float) -> RequestRouterConfig | None:
    if name == "power_of_two":
        return None  # Serve's default router
    if name == "cache_aware":
        cls: Any = RadixRequestRouter
    elif name == "prefix_cache_affinity":
        # The public ray.serve.llm re-export imports Ray Serve LLM's whole config stack
        # (pyarrow, ...); the router itself needs none of it.
        from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (
            PrefixCacheAffinityRouter,
        )
        cls = PrefixCacheAffinityRouter
    else:
        raise ValueError(f"request_router must be one of {REQUEST_ROUTERS}, got {name!r}")
    return RequestRouterConfig(request_router_class=cls,
                               request_routing_stats_period_s=period_s,
                               request_routing_stats_timeout_s=max(5.0, period_s))


def engine_server_args(ray_args: RayServeArgs, server_args: ServerArgs) -> ServerArgs:
    """The ServerArgs each replica's engine starts with. Unless `--num-threads` is given,
    a CPU replica's scheduler ranks share the CPUs Ray reserves for them (per node:
    `num_cpus_per_replica` over its `tp_size / nnodes` ranks, at least one thread each),
    as Ray sets OMP_NUM_THREADS for its own workers; an engine's default (one thread per
    physical core of the node) would oversubscribe a node shared by replicas. GPU replicas
    keep the default."""
    if (server_args.num_threads is not None or ray_args.num_gpus_per_replica
            or server_args.device == "cuda"):
        return server_args
    ranks = max(1, server_args.tp_size // max(1, server_args.nnodes))
    threads = max(1, math.floor(ray_args.num_cpus_per_replica) // ranks)
    return server_args.replace(num_threads=threads)


def build_app(ray_args: RayServeArgs, server_args: ServerArgs) -> serve.Application:
    resources = {"CPU": ray_args.num_cpus_per_replica}
    if ray_args.num_gpus_per_replica:
        resources["GPU"] = ray_args.num_gpus_per_replica
    options: dict[str, Any] = dict(
        num_replicas=ray_args.num_replicas,
        max_ongoing_requests=ray_args.max_ongoing_requests,
        health_check_period_s=2.0, health_check_timeout_s=30.0,
        graceful_shutdown_timeout_s=30.0)
    if server_args.nnodes > 1:
        options["placement_group_bundles"] = [dict(resources)] * server_args.nnodes
        options["placement_group_strategy"] = "STRICT_SPREAD"
        options["ray_actor_options"] = {"num_cpus": 0}  # the replica lives in bundle 0
    else:
        options["ray_actor_options"] = {"num_cpus": resources["CPU"],
                                        "num_gpus": resources.get("GPU", 0)}
    config = router_config(ray_args.request_router, ray_args.routing_stats_period_s)
    if config is not None:
        options["request_router_config"] = config
    engine = serve.deployment(EngineReplica).options(**options).bind(
        engine_server_args(ray_args, server_args), ray_args.engine_log_dir)
    ingress = serve.deployment(Ingress).options(
        num_replicas=1, max_ongoing_requests=10_000, ray_actor_options={"num_cpus": 0})
    return ingress.bind(engine)
