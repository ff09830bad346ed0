"""Routing on Ray Serve vs radixlm's own router: the shared-prefix workload of
`bench/routing.py` through (a) `radixlm router` (cache_aware) over N `radixlm serve`
instances, and the Ray Serve app (radixlm/ray/) with N replicas routed by (b) radixlm's
cache-aware policy, (c) Ray Serve LLM's PrefixCacheAffinityRouter, (d) Ray's default
power-of-two router.

    python -m radixlm.bench.ray_routing [--num-instances 2] [--repeat 2] ...

Targets run one after another (each with its own engines, which are started, measured
and stopped, so only N engines are up at once); each repeat flushes the caches first. Per
target: hit rate (the engines' own counters), throughput, p50/p99 TTFT, and the latency
the front adds per request (median over --overhead-requests one-token requests through
the front minus the same sent straight to one of its engines). Once: Ray's start time
(ray.init, serve.start, the app up) and the resident memory of Ray's own processes
(everything this process started except the engines).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import time
from typing import Any

import httpx

from radixlm.bench.datasets import DatasetArgs, TokenPool, to_text
from radixlm.bench.report import format_table
from radixlm.bench.routing import build_parser as routing_parser
from radixlm.bench.routing import router_spec, shared_prefix_dataset
from radixlm.bench.serve import bench_one
from radixlm.bench.serve_client import Target
from radixlm.bench.serve_load import LoadConfig
from radixlm.bench.server_proc import LaunchedServer, radixlm_spec

TARGETS = ["radixlm_router", "ray_cache_aware", "ray_prefix_cache_affinity", "ray_power_of_two"]


def build_parser() -> argparse.ArgumentParser:
    p = routing_parser()
    p.prog = "python -m radixlm.bench.ray_routing"
    p.description = __doc__.split("\n\n")[0]
    p.set_defaults(repeat=2)
    p.add_argument("--targets", nargs="+", default=TARGETS, choices=TARGETS)
    p.add_argument("--ray-num-cpus", type=int, default=None,
                   help="CPUs of the local Ray cluster (default: the machine's).")
    p.add_argument("--num-cpus-per-replica", type=float, default=None,
                   help="Default: the Ray cluster's CPUs / --num-instances.")
    p.add_argument("--overhead-requests", type=int, default=20)
    return p


def median_latency_s(url: str, n: int) -> float:
    body = {"prompt": "Hi", "max_tokens": 1, "temperature": 0}
    times = []
    with httpx.Client(timeout=120) as c:
        c.post(url + "/v1/completions", json=body)  # connection and prefix warm
        for _ in range(n):
            t0 = time.perf_counter()
            assert c.post(url + "/v1/completions", json=body).status_code == 200
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def added_latency_ms(front: str, engine: str, n: int) -> float:
    return (median_latency_s(front, n) - median_latency_s(engine, n)) * 1000.0


def ray_rss_mib() -> float:
    """RSS of this process's descendants that are not engines (nor their children)."""
    import psutil

    total = 0
    for p in psutil.Process().children(recursive=True):
        try:
            chain = [p, *p.parents()]
            if any("radixlm" in " ".join(q.cmdline()) and "serve" in q.cmdline()
                   for q in chain):
                continue
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total / 2**20


def run_target(name: str, base_url: str, ns: argparse.Namespace, tokenizer: Any,
               dataset: DatasetArgs, pool: TokenPool, records: list[dict[str, Any]],
               extra: dict[str, Any]) -> None:
    target = Target(name, base_url, "radixlm")
    for r in range(ns.repeat):
        requests = to_text(dataset.build(tokenizer, pool, seed_offset=r), tokenizer)
        load = LoadConfig(max_concurrency=ns.max_concurrency, seed=ns.seed + r,
                          show_progress=False)
        m = asyncio.run(bench_one(target, requests, load, tokenizer, num_warmup=1))
        m.pop("details")
        rec = {"target": name, "repeat": r, **m, **extra}
        records.append(rec)
        print(f"[{name} {r + 1}/{ns.repeat}] hit {m.get('server_cache_hit_rate', 0):.1%}, "
              f"{m['total_throughput']:.0f} tok/s, {m['completed']} ok / {m['failed']} failed",
              flush=True)
        if ns.output_file:
            with open(ns.output_file, "a") as f:
                f.write(json.dumps({"benchmark": "ray_routing", **rec}, default=str) + "\n")


def run_radixlm_router(ns, engine_args, run) -> None:
    with contextlib.ExitStack() as stack:
        urls = []
        for i in range(ns.num_instances):
            spec = radixlm_spec(f"instance{i}", ns.model, engine_args)
            stack.enter_context(LaunchedServer(spec))
            urls.append(spec.base_url)
        spec = router_spec("cache_aware", urls)
        stack.enter_context(LaunchedServer(spec, timeout_s=60))
        run("radixlm_router", spec.base_url,
            {"added_latency_ms": added_latency_ms(spec.base_url, urls[0], ns.overhead_requests)})


def run_ray(ns, engine_args, run) -> dict[str, float]:
    import ray
    from ray import serve

    from radixlm.bench.cold_start import free_port
    from radixlm.config import ServerArgs
    from radixlm.ray.application import build_app
    from radixlm.ray.config import RayServeArgs

    t0 = time.perf_counter()
    ray.init(num_cpus=ns.ray_num_cpus, include_dashboard=False, log_to_driver=False)
    started = {"ray_init_s": time.perf_counter() - t0}
    try:
        port = free_port()
        t0 = time.perf_counter()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        started["serve_start_s"] = time.perf_counter() - t0
        cpus = ns.num_cpus_per_replica or ray.cluster_resources()["CPU"] / ns.num_instances
        server_args = ServerArgs(model=ns.model, **engine_args)
        for name in [t for t in ns.targets if t.startswith("ray_")]:
            router = name.removeprefix("ray_")
            app = build_app(RayServeArgs(num_replicas=ns.num_instances, request_router=router,
                                         num_cpus_per_replica=cpus), server_args)
            t0 = time.perf_counter()
            serve.run(app, name=router, route_prefix=f"/{router}")
            started.setdefault("app_ready_s", time.perf_counter() - t0)
            started.setdefault("ray_rss_mib", ray_rss_mib())
            base = f"http://127.0.0.1:{port}/{router}"
            engine = httpx.get(base + "/server_info", timeout=60).json()["workers"][0]["url"]
            run(name, base, {"added_latency_ms": added_latency_ms(base, engine,
                                                                  ns.overhead_requests)})
            serve.delete(router)
    finally:
        serve.shutdown()
        ray.shutdown()
    return started


def summarize(records: list[dict[str, Any]]) -> str:
    rows = []
    for name in dict.fromkeys(r["target"] for r in records):
        recs = [r for r in records if r["target"] == name]

        def med(f: str) -> float:
            return statistics.median(r.get(f) or 0.0 for r in recs)

        rows.append([name, f"{sum(r['completed'] for r in recs)}/{sum(r['failed'] for r in recs)}",
                     f"{med('server_cache_hit_rate'):.1%}", med("request_throughput"),
                     med("total_throughput"), med("median_ttft_ms"), med("p99_ttft_ms"),
                     med("added_latency_ms")])
    return format_table(["target", "ok/fail", "hit", "req/s", "total tok/s", "TTFT p50 ms",
                         "TTFT p99 ms", "front adds ms"], rows)


def main(argv: list[str] | None = None) -> None:
    from radixlm.models.loader import resolve_model_path
    from radixlm.tokenizer.loader import load_tokenizer

    ns = build_parser().parse_args(argv)
    engine_args = dict(ns.engine_arg)
    tokenizer = load_tokenizer(resolve_model_path(ns.model))
    dataset = shared_prefix_dataset(ns)
    pool = TokenPool.from_tokenizer(tokenizer)
    records: list[dict[str, Any]] = []

    def run(name: str, url: str, extra: dict[str, Any]) -> None:
        run_target(name, url, ns, tokenizer, dataset, pool, records, extra)

    if "radixlm_router" in ns.targets:
        run_radixlm_router(ns, engine_args, run)
    started = {}
    if any(t.startswith("ray_") for t in ns.targets):
        started = run_ray(ns, engine_args, run)
    print(summarize(records))
    if started:
        print("Ray: " + ", ".join(f"{k} {v:.1f}" for k, v in started.items()))
        if ns.output_file:
            with open(ns.output_file, "a") as f:
                f.write(json.dumps({"benchmark": "ray_routing", "ray_start": started,
                                    "cpus": os.cpu_count()}) + "\n")


if __name__ == "__main__":
    main()
