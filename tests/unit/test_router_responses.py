"""The Responses API through the router, against two real radixlm HTTP apps (each over a
FakeEngine, tests/server_fakes.py): POST (streaming and not) reaches a worker; GET/DELETE
/v1/responses/{id} and `previous_response_id` reach the worker that stored the id even
when the policy would pick the other one; a router that never saw an id finds it on the
workers; an unknown id is an OpenAI-style 404 from the router itself."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest
from fastapi.testclient import TestClient

from radixlm.router.app import create_router_app
from radixlm.router.config import RouterArgs
from radixlm.router.router import Router
from tests.server_fakes import fake_stack

A, B = "http://a:1", "http://b:1"


class AppWorkers:
    """An httpx transport: each host is a real radixlm app, called through its TestClient
    (its own event loop, in a thread); streams arrive whole (content is what is checked)."""

    def __init__(self, clients: dict[str, TestClient]) -> None:
        self.clients = clients
        self.seen: list[tuple[str, str, str]] = []  # (host, method, path), /health left out

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        host, path = request.url.host, request.url.path
        if path != "/health":
            self.seen.append((host, request.method, path))
        headers = {k: v for k, v in request.headers.items() if k in ("content-type", "accept")}
        r = await asyncio.to_thread(self.clients[host].request, request.method, path,
                                    content=request.content, headers=headers)
        return httpx.Response(r.status_code, stream=httpx.ByteStream(r.content),
                              headers={"content-type": r.headers.get("content-type", "")})

    def hosts(self, method: str, path: str) -> list[str]:
        return [h for h, m, p in self.seen if m == method and p == path]


@pytest.fixture
def workers() -> Iterator[AppWorkers]:
    with ExitStack() as stack:
        clients = {}
        for host in ("a", "b"):
            s = stack.enter_context(fake_stack())
            clients[host] = stack.enter_context(TestClient(s.app))
        yield AppWorkers(clients)


def _router(workers: AppWorkers, **kw: object) -> Iterator[tuple[TestClient, Router]]:
    args = RouterArgs(health_check_interval_s=3600, policy="round_robin",
                      **kw)  # type: ignore[arg-type]
    router = Router.create(args, [A, B])
    router.client = httpx.AsyncClient(transport=httpx.MockTransport(workers))
    with TestClient(create_router_app(router)) as client:
        yield client, router


def _events(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def _is_not_found(r: httpx.Response, rid: str, param: str | None = None) -> None:
    assert r.status_code == 404, r.text
    err = r.json()["error"]
    assert rid in err["message"] and err["code"] == 404 and err.get("param") == param, err


def test_ids_reach_the_worker_that_stored_them(workers: AppWorkers) -> None:
    for client, router in _router(workers):
        first = client.post("/v1/responses", json={"input": "hello world", "max_output_tokens": 4})
        assert first.status_code == 200, first.text
        rid = first.json()["id"]
        owner = workers.hosts("POST", "/v1/responses")[-1]
        assert router.responses.worker_of(rid) == f"http://{owner}:1"
        # Round robin alternates: every follow-up would reach the other worker half the time.
        for _ in range(3):
            got = client.get(f"/v1/responses/{rid}")
            assert got.status_code == 200 and got.json() == first.json()
        assert set(workers.hosts("GET", f"/v1/responses/{rid}")) == {owner}
        chain = rid
        for i in range(3):
            r = client.post("/v1/responses", json={"input": f"and {i}", "max_output_tokens": 4,
                                                   "previous_response_id": chain})
            assert r.status_code == 200, r.text
            assert r.json()["previous_response_id"] == chain
            assert workers.hosts("POST", "/v1/responses")[-1] == owner
            chain = r.json()["id"]
        assert client.delete(f"/v1/responses/{rid}").json()["deleted"] is True
        assert workers.hosts("DELETE", f"/v1/responses/{rid}") == [owner]
        assert router.responses.worker_of(rid) is None
        _is_not_found(client.get(f"/v1/responses/{rid}"), rid)
        # A new conversation is routed by the policy again: the other worker's turn comes.
        for _ in range(2):
            assert client.post("/v1/responses", json={"input": "one two"}).status_code == 200
        assert set(workers.hosts("POST", "/v1/responses")[-2:]) == {"a", "b"}


def test_streamed_response_id_is_learnt(workers: AppWorkers) -> None:
    for client, router in _router(workers):
        r = client.post("/v1/responses", json={"input": "hello", "stream": True,
                                               "max_output_tokens": 4})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = _events(r.text)
        assert events[0]["type"] == "response.created"
        assert events[-1]["type"] == "response.incomplete"  # max_output_tokens reached
        rid = events[0]["response"]["id"]
        owner = workers.hosts("POST", "/v1/responses")[-1]
        assert router.responses.worker_of(rid) == f"http://{owner}:1"
        follow = client.post("/v1/responses", json={"input": "again", "stream": True,
                                                    "previous_response_id": rid})
        assert follow.status_code == 200
        assert _events(follow.text)[-1]["response"]["previous_response_id"] == rid
        assert workers.hosts("POST", "/v1/responses")[-1] == owner
        assert client.get(f"/v1/responses/{rid}").json() == events[-1]["response"]


def test_unknown_ids_and_unstored_responses(workers: AppWorkers) -> None:
    for client, router in _router(workers):
        _is_not_found(client.get("/v1/responses/resp_nope"), "resp_nope")
        _is_not_found(client.delete("/v1/responses/resp_nope"), "resp_nope")
        r = client.post("/v1/responses", json={"input": "hi", "previous_response_id": "resp_x"})
        _is_not_found(r, "resp_x", "previous_response_id")
        assert workers.hosts("POST", "/v1/responses") == []  # refused before any worker ran
        # Both workers were asked (no owner known), neither generated.
        assert sorted(workers.hosts("GET", "/v1/responses/resp_x")) == ["a", "b"]
        unstored = client.post("/v1/responses", json={"input": "hi", "store": False}).json()
        assert len(router.responses) == 0
        _is_not_found(client.get(f"/v1/responses/{unstored['id']}"), unstored["id"])
        # Bad input still gets the worker's own 400.
        assert client.post("/v1/responses", json={"input": "hi", "tools": [
            {"type": "web_search"}]}).status_code == 400
        assert client.get("/health").status_code == 200


def test_a_new_router_finds_ids_on_the_workers(workers: AppWorkers) -> None:
    for client, _ in _router(workers):
        rids = [client.post("/v1/responses", json={"input": f"hello {i}",
                                                      "max_output_tokens": 4}).json()["id"]
                for i in range(2)]
        owners = workers.hosts("POST", "/v1/responses")
    assert sorted(owners) == ["a", "b"]
    for client, router in _router(workers, response_affinity_size=1):
        for rid, owner in zip(rids, owners):
            assert client.get(f"/v1/responses/{rid}").status_code == 200
            assert router.responses.worker_of(rid) == f"http://{owner}:1"
            r = client.post("/v1/responses", json={"input": "more", "max_output_tokens": 4,
                                                   "previous_response_id": rid})
            assert r.status_code == 200 and workers.hosts("POST", "/v1/responses")[-1] == owner
        assert len(router.responses) == 1  # its capacity: the least recently used went
