"""radixlm on Ray Serve (radixlm/ray/): a local Ray cluster (2 CPUs, object store capped)
running two applications of 2 replicas of the default model side by side, one routed by
radixlm's cache-aware policy, one by Ray's default power-of-two router, and a single
`radixlm serve` to compare answers with (the session's shared default-model server of
tests/e2e/conftest.py: greedy answers do not depend on its pool flags). Same
shared-prefix workload through both apps: each prefix group lands on one replica (>= 90%),
both replicas work, the cache-aware hit rate is clearly above the default router's;
greedy answers equal the single server's; a replica killed mid-load is replaced by Serve
and no request hangs or goes unanswered."""

from __future__ import annotations

import concurrent.futures as cf
import os
import random
import time
from collections import Counter, defaultdict

import httpx
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from radixlm.config import ServerArgs  # noqa: E402
from radixlm.ray.application import build_app  # noqa: E402
from radixlm.ray.config import RayServeArgs  # noqa: E402
from radixlm.ray.routed_request import REPLICA_HEADER  # noqa: E402
from tests.process_tree import free_port  # noqa: E402

pytestmark = pytest.mark.slow

# A small KV pool: five engines (2 apps x 2 replicas + the single server) share the host;
# each replica's engine detokenizes in its API process (two processes each, not three:
# the engines' own start-up is not what this module tests).
ENGINE = ServerArgs(device_memory="2GiB", max_total_tokens=4096, log_level="warning",
                    detokenizer_mode="api")
APPS = {"ca": "cache_aware", "p2": "power_of_two"}
GROUPS, PER_GROUP = 6, 4


def apps_running(names: list[str]) -> bool:
    st = serve.status().applications
    return all(n in st and st[n].status == "RUNNING" for n in names)


def engine_replicas(app: str) -> int:
    st = serve.status().applications.get(app)
    if st is None:
        return 0
    return st.deployments["EngineReplica"].replica_states.get("RUNNING", 0)


@pytest.fixture(scope="module")
def deployment(default_server: str):
    ray.init(num_cpus=2, object_store_memory=80 * 2**20, include_dashboard=False,
             log_to_driver=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run_many([serve.RunTarget(build_app(RayServeArgs(
            num_replicas=2, num_cpus_per_replica=0.5, request_router=router,
            routing_stats_period_s=1.0), ENGINE), name=name, route_prefix=f"/{name}")
            for name, router in APPS.items()], wait_for_applications_running=False)
        deadline = time.monotonic() + 400
        while not apps_running(list(APPS)):
            assert time.monotonic() < deadline, serve.status()
            time.sleep(1)
        yield {"base": f"http://127.0.0.1:{port}", "single": default_server}
    finally:
        serve.shutdown()
        ray.shutdown()


def prompts(seed: int) -> list[tuple[int, str]]:
    """(group, prompt): GROUPS long shared prefixes, PER_GROUP short questions each,
    groups interleaved (g0q0, g1q0, ...)."""
    rng = random.Random(seed)
    words = "river stone maple cloud lantern copper meadow signal harbor violet".split()
    prefix = [f"Document {seed}-{g}: " + " ".join(rng.choice(words) for _ in range(120))
              for g in range(GROUPS)]
    return [(g, f"{prefix[g]}\nQuestion {q}: what is word {q + 3}?")
            for q in range(PER_GROUP) for g in range(GROUPS)]


def complete(url: str, prompt: str, max_tokens: int = 4, stream: bool = False) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    return httpx.post(url + "/v1/completions", json=body, timeout=300)


def hit_rate(base: str, run) -> float:
    before = httpx.get(base + "/server_info", timeout=60).json()["pool"]
    run()
    after = httpx.get(base + "/server_info", timeout=60).json()["pool"]
    prompt = after["prompt_tokens_total"] - before["prompt_tokens_total"]
    return (after["cached_tokens_total"] - before["cached_tokens_total"]) / prompt


def assert_pools_free(base: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        workers = httpx.get(base + "/server_info", timeout=60).json()["workers"]
        pools = [w["body"]["pool"] for w in workers]
        if all(p["running"] == 0 and p["waiting"] == 0 for p in pools):
            break
        assert time.monotonic() < deadline, pools
        time.sleep(0.2)
    for p in pools:
        assert p["invariant_error"] is None and p["held_by_requests"] == 0, p
        assert p["free_kv_slots"] + p["held_by_cache"] == p["total_kv_slots"], p


def test_prefix_groups_stay_on_one_replica_and_beat_the_default_router(deployment):
    rates, placement = {}, {}
    for name in APPS:  # same workload, one app after the other
        base = f"{deployment['base']}/{name}"
        assert httpx.post(base + "/flush_cache", timeout=60).status_code == 200
        served: dict[int, list[str]] = defaultdict(list)

        def run() -> None:
            work = prompts(seed=1)
            with cf.ThreadPoolExecutor(4) as pool:
                for (g, _), r in zip(work, pool.map(lambda w: complete(base, w[1]), work)):
                    assert r.status_code == 200, r.text
                    served[g].append(r.headers[REPLICA_HEADER])

        rates[name] = hit_rate(base, run)
        placement[name] = served
        assert_pools_free(base)
    ca = placement["ca"]
    for g, replicas in ca.items():
        top = Counter(replicas).most_common(1)[0][1]
        assert top >= 0.9 * len(replicas), (g, replicas)
    assert len({r for replicas in ca.values() for r in replicas}) == 2, ca  # both work
    assert rates["ca"] > rates["p2"] + 0.1, rates
    print(f"hit rate: cache_aware {rates['ca']:.1%}, power_of_two {rates['p2']:.1%}")


def test_answers_equal_a_single_server(deployment):
    questions = ["The capital of France is", "def fibonacci(n):", "Once upon a time,"]
    base = f"{deployment['base']}/ca"
    for q in questions:  # one at a time: no batching differences
        want = complete(deployment["single"], q, max_tokens=12).json()["choices"][0]["text"]
        got = complete(base, q, max_tokens=12).json()["choices"][0]["text"]
        assert got == want, (q, got, want)
    r = complete(base, questions[0], max_tokens=12, stream=True)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.text.rstrip().endswith("data: [DONE]"), r.text[-200:]
    bad = httpx.post(base + "/v1/completions", json={"prompt": "x", "max_tokens": -1}, timeout=60)
    assert bad.status_code == 400, bad.text  # the engine's own 4xx, through the ingress
    assert_pools_free(base)


def test_killed_replica_is_replaced_and_no_request_hangs(deployment):
    base = f"{deployment['base']}/ca"
    work = prompts(seed=2)
    victim = next(n for n in ray.util.list_named_actors(all_namespaces=True)
                  if "::ca#EngineReplica#" in n["name"])

    def one(i: int) -> tuple[bool, int]:
        stream = i % 6 == 5
        r = complete(base, work[i % len(work)][1], max_tokens=24, stream=stream)
        if stream and r.status_code == 200:  # a stream the kill cut says so, then ends
            assert r.text.rstrip().endswith("data: [DONE]"), r.text[-300:]
        return stream, r.status_code

    with cf.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(one, i) for i in range(18)]
        time.sleep(3)
        ray.kill(ray.get_actor(victim["name"], namespace=victim["namespace"]), no_restart=True)
        results = [f.result(timeout=300) for f in futures]  # none hangs
    assert all(code == 200 for stream, code in results if not stream), results
    assert all(code in (200, 503) for stream, code in results), results
    deadline = time.monotonic() + 400
    while engine_replicas("ca") < 2 or len(httpx.get(base + "/server_info", timeout=60)
                                            .json()["workers"]) < 2:
        assert time.monotonic() < deadline, serve.status()
        time.sleep(1)
    names = {n["name"] for n in ray.util.list_named_actors(all_namespaces=True)}
    assert victim["name"] not in names
    assert complete(base, "After the restart,").status_code == 200
    assert_pools_free(base)
