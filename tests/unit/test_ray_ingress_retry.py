"""The Ray Serve ingress retries a non-streaming request whose replica dies at any point
before the whole body reached the ingress (before the head, or between the head and the
body), until its deadline; a stream is never retried. No cluster: the replica handle is a
fake that fails as a killed replica's generator does (a RayError from `__anext__`)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")

from ray.exceptions import RayError  # noqa: E402
from starlette.requests import Request  # noqa: E402

from radixlm.ray import ingress  # noqa: E402


class FakeGen:
    """A replica's response generator: yields `items`, raising RayError at `fail_at`."""

    def __init__(self, items: list, fail_at: int | None) -> None:
        self.items, self.fail_at, self.i, self.cancelled = items, fail_at, 0, False

    def __aiter__(self) -> "FakeGen":
        return self

    async def __anext__(self):
        if self.i == self.fail_at:
            raise RayError("the replica died")
        if self.i >= len(self.items):
            raise StopAsyncIteration
        self.i += 1
        return self.items[self.i - 1]

    def cancel(self) -> None:
        self.cancelled = True


class FakeHandle:
    """`handle.options(stream=True).forward.remote(req)`; try k fails at `fails[k]`."""

    def __init__(self, fails: list[int | None]) -> None:
        self.fails, self.gens = fails, []
        self.forward = self

    def options(self, **_: object) -> "FakeHandle":
        return self

    def remote(self, req: object) -> FakeGen:
        fail_at = self.fails[len(self.gens)] if len(self.gens) < len(self.fails) else None
        head = {"status": 200, "headers": {"content-type": "application/json"}}
        gen = FakeGen([head, b'{"ok"', b": true}"], fail_at)
        self.gens.append(gen)
        return gen


def request(body: dict) -> Request:
    raw = json.dumps(body).encode()

    async def receive() -> dict:
        return {"type": "http.request", "body": raw, "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "query_string": b"",
             "headers": [(b"content-type", b"application/json")]}
    return Request(scope, receive)


def retry_setting(monkeypatch, name: str, value: float) -> None:
    # serve.ingress hands the class through cloudpickle: its methods read a copy of the
    # module's globals, so patch the dict they read.
    monkeypatch.setitem(ingress.Ingress.forward.__globals__, name, value)


def call(fails: list[int | None], body: dict, monkeypatch) -> tuple[object, FakeHandle]:
    retry_setting(monkeypatch, "RETRY_BACKOFF_S", 0.001)
    app = SimpleNamespace(engine=FakeHandle(fails))  # no replica context, no __init__
    app._start = lambda req: ingress.Ingress._start(app, req)
    app._exchange = lambda req: ingress.Ingress._exchange(app, req)
    resp = asyncio.run(ingress.Ingress.forward(app, request(body), "v1/completions"))
    return resp, app.engine


@pytest.mark.parametrize("fails", [[0], [1], [2], [0, 2, 1]])
def test_non_streaming_request_is_retried_wherever_the_replica_died(fails, monkeypatch):
    resp, handle = call(fails, {"prompt": "x"}, monkeypatch)
    assert resp.status_code == 200 and resp.body == b'{"ok": true}'
    assert len(handle.gens) == len(fails) + 1
    assert all(g.cancelled for g in handle.gens[:-1])  # each failed try was cancelled


def test_retries_stop_at_the_deadline(monkeypatch):
    retry_setting(monkeypatch, "RETRY_DEADLINE_S", 0.05)
    retry_setting(monkeypatch, "RETRY_BACKOFF_MAX_S", 0.02)
    resp, handle = call([1] * 10_000, {"prompt": "x"}, monkeypatch)
    assert resp.status_code == 503 and json.loads(resp.body)["error"]["code"] == 503
    assert 1 < len(handle.gens) < 10_000


def test_a_stream_is_not_retried(monkeypatch):
    resp, handle = call([0], {"prompt": "x", "stream": True}, monkeypatch)
    assert resp.status_code == 503 and len(handle.gens) == 1
