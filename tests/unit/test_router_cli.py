"""`radixlm router` / `serve --dp-size` flags, policy construction, the dp launcher's GPU
assignment, and the routing benchmark's summary."""

from __future__ import annotations

import pytest

from radixlm.cli import build_parser
from radixlm.config import from_cli_args
from radixlm.bench.routing import summarize
from radixlm.router.cache_aware import CacheAwarePolicy
from radixlm.router.config import RouterArgs
from radixlm.config import ServerArgs
from radixlm.router.launch_dp import DPLaunchError, InstancePlacement, place_instances, visible_gpus
from radixlm.router.policy import POLICY_NAMES
from radixlm.router.router import make_policy


def test_router_flags() -> None:
    ns = build_parser().parse_args([
        "router", "--worker-urls", "http://a:1", "b:2", "--policy", "power_of_two",
        "--cache-threshold", "0.25", "--balance-abs-threshold", "8", "--max-tree-size", "1000",
        "--health-check-interval-s", "1.5", "--port", "31000"])
    args: RouterArgs = from_cli_args(ns, RouterArgs)
    assert ns.worker_urls == ["http://a:1", "b:2"]
    assert (args.policy, args.cache_threshold, args.balance_abs_threshold, args.max_tree_size,
            args.health_check_interval_s, args.port) == ("power_of_two", 0.25, 8, 1000, 1.5, 31000)
    cfg = args.cache_aware_config()
    assert (cfg.cache_threshold, cfg.balance_abs_threshold, cfg.max_tree_size) == (0.25, 8, 1000)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["router", "--policy", "nope"])


def test_serve_dp_size_flag() -> None:
    ns = build_parser().parse_args(["serve", "--dp-size", "3"])
    assert ns.dp_size == 3
    assert build_parser().parse_args(["serve"]).dp_size == 1


def test_make_policy_by_name() -> None:
    for name in POLICY_NAMES:
        assert make_policy(RouterArgs(policy=name)).name == name
    assert isinstance(make_policy(RouterArgs()), CacheAwarePolicy)


def test_visible_gpus_follows_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert visible_gpus() == ["2", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == []


def test_place_instances() -> None:
    gib = 2**30
    cpu = place_instances(ServerArgs(dp_size=2), [], 8 * gib)
    assert cpu == [InstancePlacement(None, "4096MiB")] * 2
    assert place_instances(ServerArgs(dp_size=2, device_memory="3GiB"), [], 8 * gib) == \
        [InstancePlacement(None, "3GiB")] * 2
    gpu = place_instances(ServerArgs(dp_size=2, tp_size=2), ["0", "1", "2", "3"], 0)
    assert [p.cuda_visible_devices for p in gpu] == ["0,1", "2,3"]
    assert all(p.device_memory is None for p in gpu)
    with pytest.raises(DPLaunchError, match="--device-memory"):
        place_instances(ServerArgs(dp_size=3), ["0", "1"], 0)
    shared = place_instances(ServerArgs(dp_size=3, device_memory="40GB"), ["0", "1"], 0)
    assert [p.cuda_visible_devices for p in shared] == ["0", "1", "0"]


def test_bench_summary_medians_and_ratios() -> None:
    def rec(policy: str, hit: float, tput: float) -> dict:
        return {"policy": policy, "completed": 36, "failed": 0, "server_cache_hit_rate": hit,
                "cache_hit_rate": hit, "output_throughput": tput / 10, "total_throughput": tput,
                "request_throughput": tput / 100, "median_ttft_ms": 1.0,
                "median_e2e_latency_ms": 2.0, "duration": 3.0}

    records = [rec("cache_aware", h, t) for h, t in ((0.6, 300), (0.7, 100), (0.65, 200))]
    records += [rec("round_robin", h, t) for h, t in ((0.4, 100), (0.3, 150), (0.2, 50))]
    table, ratios = summarize(records, ["cache_aware", "round_robin"])
    assert "65.0%" in table and "30.0%" in table and "108/0" in table
    assert ratios["server_cache_hit_rate cache_aware/round_robin"] == pytest.approx(0.65 / 0.3)
    assert ratios["total_throughput cache_aware/round_robin"] == pytest.approx(200 / 100)
