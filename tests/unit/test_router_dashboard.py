"""The router's /dashboard against fake workers (an httpx mock transport): the page is
open, the event stream needs the key, and an update carries each instance's load, cache
hit rate and state, and where the last requests went and why."""

from __future__ import annotations

import json

import httpx
from fastapi.testclient import TestClient

from radixlm.router.app import create_router_app
from radixlm.router.config import RouterArgs
from radixlm.router.router import Router

A, B, DEAD = "http://a:1", "http://b:1", "http://dead:1"
KEY = "router-key"
PREFIX = "A long shared system prompt that every request of this group starts with. " * 3
HIT_RATE = {"a": 0.25, "b": 0.75}


async def fake_worker(request: httpx.Request) -> httpx.Response:
    host = request.url.host
    if host == "dead":
        raise httpx.ConnectError("connection refused", request=request)
    if request.url.path == "/server_info":
        assert request.headers.get("authorization") == f"Bearer {KEY}"
        return httpx.Response(200, json={"pool": {
            "total_kv_slots": 1000, "free_kv_slots": 900, "held_by_requests": 60,
            "held_by_cache": 40, "running": 2, "waiting": 1, "cache_hit_rate": HIT_RATE[host]}})
    if request.url.path == "/health":
        return httpx.Response(200, json={"status": "ok"})
    return httpx.Response(200, json={"worker": host})


def one_update(client: TestClient, headers: dict[str, str]) -> dict:
    with client.stream("GET", "/dashboard/events", headers=headers) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                return json.loads(line[6:])
    raise AssertionError("no update")


def test_router_dashboard() -> None:
    router = Router.create(RouterArgs(health_check_interval_s=3600, api_key=KEY), [A, B, DEAD])
    router.client = httpx.AsyncClient(transport=httpx.MockTransport(fake_worker))
    auth = {"Authorization": f"Bearer {KEY}"}
    with TestClient(create_router_app(router)) as client:
        page = client.get("/dashboard")
        assert page.status_code == 200 and "radixlm router" in page.text
        assert client.get("/dashboard/static/router.js").status_code == 200
        assert client.get("/dashboard/events").status_code == 401
        router.registry.set_healthy(DEAD, False)
        for i in range(4):
            r = client.post("/v1/completions", headers=auth, json={"prompt": PREFIX + f"q{i}"})
            assert r.status_code == 200, r.text
        router.exiting = True  # the stream ends after one update (as at shutdown)
        update = one_update(client, auth)
    workers = {w["url"]: w for w in update["workers"]}
    assert workers[A]["pool"]["cache_hit_rate"] == 0.25
    assert workers[B]["pool"]["cache_hit_rate"] == 0.75
    assert workers[DEAD]["healthy"] is False and "ConnectError" in workers[DEAD]["error"]
    assert all(w["load"] == 0 for w in workers.values())  # every request finished
    assert update["policy"] == "cache_aware" and update["routed_total"] == 4
    decisions = update["decisions"]
    assert [d["seq"] for d in decisions] == [1, 2, 3, 4]
    # The first request has no cached prefix anywhere; the later ones follow the shared one.
    assert decisions[0]["reason"] in ("cache_miss", "imbalance")
    assert {d["reason"] for d in decisions[1:]} == {"cache_hit"}
    assert len({d["worker"] for d in decisions[1:]}) == 1
    assert all(d["match_ratio"] > 0.5 for d in decisions[1:])
    assert set(decisions[0]["loads"]) == {A, B}  # the candidates: the dead one is out
