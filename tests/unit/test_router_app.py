"""The router's HTTP app against fake workers (an httpx mock transport, no processes):
pass-through, affinity, retries, a stream cut mid-way, worker management, health checks,
metrics, and load released on every path."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from radixlm.router.app import create_router_app
from radixlm.router.config import RouterArgs
from radixlm.router.health import check_worker
from radixlm.router.router import Router

A, B = "http://a:1", "http://b:1"
DEAD, BROKEN, CUT = "http://dead:1", "http://broken:1", "http://cut:1"
BUSY = "http://busy:1"
PREFIX = "A long shared system prompt that every request of this group starts with. " * 3


class FakeWorkers:
    """Answers like radixlm instances, by host: a/b work, dead refuses connections,
    broken answers 500, cut streams one chunk then breaks."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []  # (host, path) of every request
        self.auth: list[str | None] = []  # the Authorization header of every request
        self.down: set[str] = {"dead"}

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        host, path = request.url.host, request.url.path
        self.seen.append((host, path))
        self.auth.append(request.headers.get("authorization"))
        if host in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if host == "broken":
            return httpx.Response(500, json={"error": {"message": "boom", "code": 500}})
        if host == "busy":  # a full queue (radixlm/server/admission.py)
            return httpx.Response(429, headers={"retry-after": "1"},
                                  json={"error": {"message": "overloaded", "code": 429}})
        if path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": host}]})
        body = json.loads(request.content)
        if body.get("max_tokens") == -1:
            return httpx.Response(400, json={"error": {"message": "bad max_tokens"}})
        if not body.get("stream"):
            return httpx.Response(200, json={"worker": host, "prompt": body.get("prompt")})
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              stream=_Events(host, cut=host == "cut"))


class _Events(httpx.AsyncByteStream):
    def __init__(self, host: str, cut: bool) -> None:
        self.host, self.cut = host, cut

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i in range(3):
            yield f'data: {{"worker": "{self.host}", "i": {i}}}\n\n'.encode()
            if self.cut:
                raise httpx.ReadError("connection reset by peer")
        yield b"data: [DONE]\n\n"


def _client(urls: list[str], fake: FakeWorkers, **kw: object) -> Iterator[tuple[TestClient, Router]]:
    args = RouterArgs(health_check_interval_s=3600, **kw)  # type: ignore[arg-type]
    router = Router.create(args, urls)
    router.client = httpx.AsyncClient(transport=httpx.MockTransport(fake))
    with TestClient(create_router_app(router)) as client:
        yield client, router


@pytest.fixture
def fake() -> FakeWorkers:
    return FakeWorkers()


def _loads(client: TestClient) -> dict[str, int]:
    return {w["url"]: w["load"] for w in client.get("/workers").json()["workers"]}


def test_affinity_and_metrics(fake: FakeWorkers) -> None:
    for client, _ in _client([A, B], fake):
        hosts = [client.post("/v1/completions", json={"prompt": PREFIX + f"q{i}"}).json()["worker"]
                 for i in range(4)]
        assert len(set(hosts)) == 1
        other = client.post("/v1/completions", json={"prompt": "something else " * 5}).json()
        assert other["worker"] != hosts[0]  # a miss goes to the least loaded (ties: order)
        metrics = client.get("/metrics").text
        assert 'decision="cache_hit"' in metrics and 'decision="cache_miss"' in metrics
        assert "radixlm_router_cache_match_ratio_bucket" in metrics
        assert 'radixlm_router_worker_load{worker="http://a:1"} 0.0' in metrics
        assert _loads(client) == {A: 0, B: 0}
        assert client.get("/v1/models").json()["object"] == "list"
        assert 'decision="first_healthy"' not in client.get("/metrics").text  # not routed


def test_connection_failure_is_retried_and_worker_taken_out(fake: FakeWorkers) -> None:
    for client, router in _client([DEAD, A], fake, policy="round_robin"):
        for i in range(4):
            r = client.post("/v1/completions", json={"prompt": f"p{i}"})
            assert r.status_code == 200 and r.json()["worker"] == "a"
        workers = {w["url"]: w for w in client.get("/workers").json()["workers"]}
        assert workers[DEAD]["healthy"] is False and workers[DEAD]["load"] == 0
        assert fake.seen.count(("dead", "/v1/completions")) == 1  # out after one failure
        assert "radixlm_router_retries_total 1.0" in client.get("/metrics").text
        # Back in rotation once a health check passes.
        fake.down.clear()
        asyncio.run(check_worker(router, router.registry.get(DEAD)))
        assert router.registry.get(DEAD).healthy


def test_5xx_is_retried_then_passed_through(fake: FakeWorkers) -> None:
    for client, _ in _client([BROKEN, A], fake, policy="round_robin"):
        r = client.post("/v1/completions", json={"prompt": "x"})
        assert r.status_code == 200 and r.json()["worker"] == "a"
    for client, _ in _client([BROKEN], fake):
        r = client.post("/v1/completions", json={"prompt": "x"})
        assert r.status_code == 500 and r.json()["error"]["message"] == "boom"
        r = client.post("/v1/completions", json={"prompt": "x", "stream": True})
        assert r.status_code == 500
        assert _loads(client) == {BROKEN: 0}


def test_429_tries_another_worker_and_keeps_the_busy_one(fake: FakeWorkers) -> None:
    for client, router in _client([BUSY, A], fake, policy="round_robin"):
        for stream in (False, True):
            for i in range(2):
                r = client.post("/v1/completions", json={"prompt": f"q{i}", "stream": stream})
                assert r.status_code == 200 and '"worker": "a"' in r.text.replace('":"', '": "')
        assert router.registry.get(BUSY).healthy  # busy is not broken
        tried_busy = fake.seen.count(("busy", "/v1/completions"))
        assert tried_busy >= 1
        assert f"radixlm_router_overloaded_total {tried_busy:.1f}" in client.get("/metrics").text
        assert _loads(client) == {BUSY: 0, A: 0}
    for client, _ in _client([BUSY], fake):  # nobody else: the 429 is the answer
        for stream in (False, True):
            r = client.post("/v1/completions", json={"prompt": "x", "stream": stream})
            assert r.status_code == 429 and r.headers["retry-after"] == "1", r.text


def test_client_errors_pass_through_unretried(fake: FakeWorkers) -> None:
    for client, _ in _client([A, B], fake):
        for stream in (False, True):
            r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": -1,
                                                     "stream": stream})
            assert r.status_code == 400 and "bad max_tokens" in r.text
        assert fake.seen.count(("a", "/v1/completions")) + \
            fake.seen.count(("b", "/v1/completions")) == 2


def test_stream_passes_through(fake: FakeWorkers) -> None:
    for client, _ in _client([DEAD, A], fake, policy="round_robin"):
        with client.stream("POST", "/v1/completions", json={"prompt": "x", "stream": True}) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            events = [line for line in r.iter_lines() if line]
        assert events[-1] == "data: [DONE]"
        assert [json.loads(e[6:])["i"] for e in events[:-1]] == [0, 1, 2]
        assert _loads(client) == {DEAD: 0, A: 0}


def test_stream_cut_mid_way_ends_with_error_event(fake: FakeWorkers) -> None:
    for client, router in _client([CUT], fake):
        r = client.post("/v1/completions", json={"prompt": "x", "stream": True})
        events = [line for line in r.text.splitlines() if line]
        assert json.loads(events[0][6:])["i"] == 0
        error = json.loads(events[1][6:])["error"]
        assert error["code"] == 503 and "failed mid-way" in error["message"]
        assert events[-1] == "data: [DONE]"
        assert router.registry.get(CUT).load == 0
        assert not router.registry.get(CUT).healthy  # connection broke: out of rotation
        assert "radixlm_router_stream_errors_total 1.0" in client.get("/metrics").text


def test_worker_management_and_health(fake: FakeWorkers) -> None:
    for client, _ in _client([A], fake):
        r = client.post("/workers", json={"url": "b:1/"})
        assert r.status_code == 200 and r.json()["added"] == B
        assert {w["url"] for w in r.json()["workers"]} == {A, B}
        assert client.post("/workers", json={"nope": 1}).status_code == 400
        assert client.delete("/workers/http://b:1").status_code == 200
        assert client.delete("/workers/http%3A%2F%2Fa%3A1").status_code == 200
        assert client.delete("/workers/http://a:1").status_code == 404
        assert client.get("/health").status_code == 503
        r = client.post("/v1/completions", json={"prompt": "x"})
        assert r.status_code == 503 and "No worker" in r.json()["error"]["message"]
        r = client.post("/v1/completions", json={"prompt": "x", "stream": True})
        assert r.status_code == 503
        client.post("/workers", json={"url": B})
        assert client.get("/health").json()["healthy_workers"] == 1
        assert client.post("/v1/completions", json={"prompt": "x"}).json()["worker"] == "b"


def test_health_checks_take_out_after_threshold_and_bring_back(fake: FakeWorkers) -> None:
    router = Router.create(RouterArgs(health_failure_threshold=2, health_success_threshold=2),
                           [A])
    router.client = httpx.AsyncClient(transport=httpx.MockTransport(fake))
    w = router.registry.get(A)

    async def checks(n: int) -> None:
        for _ in range(n):
            await check_worker(router, w)

    fake.down.add("a")
    asyncio.run(checks(1))
    assert w.healthy
    asyncio.run(checks(1))
    assert not w.healthy
    fake.down.clear()
    asyncio.run(checks(1))
    assert not w.healthy
    asyncio.run(checks(1))
    assert w.healthy


def test_relay_closed_early_releases_load(fake: FakeWorkers) -> None:
    """A client that hangs up closes the relay generator: load back to 0, worker
    response closed."""
    from radixlm.router.proxy import _relay

    router = Router.create(RouterArgs(), [A])
    w = router.registry.get(A)

    async def main() -> None:
        client = httpx.AsyncClient(transport=httpx.MockTransport(fake))
        resp = await client.send(client.build_request(
            "POST", A + "/v1/completions", json={"prompt": "x", "stream": True}), stream=True)
        gen = _relay(router, resp, router.registry.guard(w).acquire())
        assert w.load == 1
        first = await gen.__anext__()
        assert b'"i": 0' in first
        await gen.aclose()
        assert w.load == 0 and resp.is_closed

    asyncio.run(main())


def test_api_key_guards_everything_but_health(fake: FakeWorkers) -> None:
    for client, router in _client([A], fake, api_key="sekret"):
        good = {"Authorization": "Bearer sekret"}
        for bad in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}):
            for method, path, body in (("POST", "/v1/completions", {"prompt": "x"}),
                                       ("POST", "/v1/chat/completions", {"messages": []}),
                                       ("POST", "/generate", {"text": "x"}),
                                       ("GET", "/v1/models", None), ("GET", "/metrics", None),
                                       ("GET", "/workers", None), ("GET", "/server_info", None),
                                       ("POST", "/flush_cache", None),
                                       ("POST", "/workers", {"url": "http://evil:1"}),
                                       ("DELETE", f"/workers/{A}", None)):
                r = client.request(method, path, json=body, headers=bad)
                assert r.status_code == 401, (method, path, bad)
                assert r.json()["error"]["type"] == "authentication_error"
        assert [w.url for w in router.registry.all()] == [A]  # nothing was added or removed
        assert ("a", "/v1/completions") not in fake.seen  # nothing reached the worker
        assert client.get("/health").status_code == 200  # open, for load balancers
        r = client.post("/v1/completions", json={"prompt": "x"}, headers=good)
        assert r.status_code == 200 and fake.auth[-1] == "Bearer sekret"  # forwarded
        assert client.get("/workers", headers=good).status_code == 200
