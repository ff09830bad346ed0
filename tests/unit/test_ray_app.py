"""The Ray Serve application as `serve run radixlm.ray:app` and `radixlm serve-ray` build
it (no cluster needed to build): the routers by name, the per-replica resources, and the
placement group of a replica whose TP ranks span Ray nodes."""

import pytest

serve = pytest.importorskip("ray.serve")

from radixlm.config import ServerArgs  # noqa: E402
from radixlm.ray.application import build_app, router_config  # noqa: E402
from radixlm.ray.config import RayServeArgs  # noqa: E402
from radixlm.ray.request_router import RadixRequestRouter  # noqa: E402


def engine_deployment(app):
    return app._bound_deployment.init_args[0]._bound_deployment


def test_module_attribute_app_is_a_serve_application():
    import radixlm.ray

    app = radixlm.ray.app
    assert isinstance(app, serve.Application)
    engine = engine_deployment(app)
    assert engine.num_replicas == 1
    assert engine.ray_actor_options["num_cpus"] == 1.0


def test_routers_by_name():
    assert router_config("power_of_two", 1.0) is None  # Serve's default
    ca = router_config("cache_aware", 0.5)
    assert ca.get_request_router_class() is RadixRequestRouter
    assert ca.request_routing_stats_period_s == 0.5
    pca = router_config("prefix_cache_affinity", 1.0)
    assert pca.get_request_router_class().__name__ == "PrefixCacheAffinityRouter"
    with pytest.raises(ValueError):
        router_config("nope", 1.0)


def test_tp_over_nodes_reserves_one_bundle_per_node():
    app = build_app(RayServeArgs(num_replicas=2, num_cpus_per_replica=4,
                                 num_gpus_per_replica=2),
                    ServerArgs(tp_size=4, nnodes=2))
    engine = engine_deployment(app)
    assert engine.num_replicas == 2
    assert engine._deployment_config is not None
    replica_config = engine._replica_config
    assert replica_config.placement_group_bundles == [{"CPU": 4, "GPU": 2}] * 2
    assert replica_config.placement_group_strategy == "STRICT_SPREAD"
    assert replica_config.ray_actor_options["num_cpus"] == 0


def test_cpu_engines_compute_with_the_cpus_ray_reserves():
    def threads(ray_args: RayServeArgs, server_args: ServerArgs) -> int | None:
        return engine_deployment(build_app(ray_args, server_args)).init_args[0].num_threads

    assert threads(RayServeArgs(num_cpus_per_replica=0.5), ServerArgs()) == 1
    assert threads(RayServeArgs(num_cpus_per_replica=8), ServerArgs()) == 8
    assert threads(RayServeArgs(num_cpus_per_replica=6.9), ServerArgs()) == 6
    # per node, shared by the node's TP ranks (4 ranks over 2 nodes: 2 per node)
    assert threads(RayServeArgs(num_cpus_per_replica=8), ServerArgs(tp_size=4, nnodes=2)) == 4
    assert threads(RayServeArgs(num_cpus_per_replica=1), ServerArgs(tp_size=4)) == 1
    # an explicit --num-threads wins; GPU replicas keep the engine's default
    assert threads(RayServeArgs(num_cpus_per_replica=8), ServerArgs(num_threads=3)) == 3
    assert threads(RayServeArgs(num_cpus_per_replica=8, num_gpus_per_replica=1),
                   ServerArgs()) is None
    assert threads(RayServeArgs(num_cpus_per_replica=8), ServerArgs(device="cuda")) is None
