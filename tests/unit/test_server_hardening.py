"""Holes the API fuzzer and the hardening issue named, on the real app + TokenizerManager
over ZMQ with the FakeEngine: malformed conversations and values are 400s with an
OpenAI-style body; the queue limit answers 429 with Retry-After; a deadline aborts the
request in the engine (408); a draining server answers 503."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.server_fakes import FakeStack, fake_stack

USER = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def stack() -> Iterator[FakeStack]:
    with fake_stack(context_len=256) as s:
        yield s


@pytest.fixture(scope="module")
def client(stack: FakeStack) -> Iterator[TestClient]:
    with TestClient(stack.app) as c:
        yield c


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and isinstance(err["message"], str) and err["type"]
    return err


@pytest.mark.parametrize("body, needle", [
    ({"messages": [{"role": "user"}]}, "needs 'content'"),
    ({"messages": [{"role": "assistant"}]}, "needs 'content' (or 'tool_calls')"),
    ({"messages": [{"role": "tool", "content": "42", "tool_call_id": "a"}]}, "first message"),
    ({"messages": [*USER, {"role": "tool", "content": "42"}]}, "after a user message"),
    ({"messages": []}, "messages"),
    ({"messages": USER, "seed": -3}, "seed must be in [0, 2**63)"),
    ({"messages": USER, "seed": 2**64}, "seed"),
    ({"messages": USER, "logprobs": True, "top_logprobs": 10**12}, "top_logprobs"),
    ({"messages": USER, "n": 10**6}, "n"),
    ({"messages": USER, "timeout": 0}, "timeout"),
    ({"messages": USER, "timeout": -1}, "timeout"),
])
def test_bad_chat_requests_are_400(client: TestClient, body: dict, needle: str) -> None:
    err = error_of(client.post("/v1/chat/completions", json=body), 400)
    assert needle in err["message"], err


def test_assistant_with_tool_calls_needs_no_content(client: TestClient) -> None:
    calls = [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    msgs = [*USER, {"role": "assistant", "tool_calls": calls},
            {"role": "tool", "content": "42", "tool_call_id": "a"}]
    r = client.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 2})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("raw", [
    b'{"prompt": "\xff\xfe hello", "max_tokens": 2}',  # not UTF-8
    b'{"prompt": "a", "temperature": NaN}',
    b'{"prompt": "a", "temperature": Infinity}',
    b'{"prompt": "a", "response_format": ' + b'{"a": ' * 5000 + b'1' + b'}' * 5000 + b'}',
    b'{"prompt": "a", "logprobs": 100000000000000000000000}',
    b'[' * 100000,
])
def test_malformed_bodies_are_400(client: TestClient, raw: bytes) -> None:
    r = client.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    error_of(r, 400)


def test_more_choices_than_the_server_holds_is_400(client: TestClient,
                                                    stack: FakeStack) -> None:
    cap = stack.tokenizer_manager.admission.capacity
    err = error_of(client.post("/v1/completions", json={"prompt": ["a", "b"], "n": cap // 2 + 1,
                                                         "max_tokens": 1}), 400)
    assert "choices (prompts x n)" in err["message"]
    r = client.post("/v1/completions", json={"prompt": ["a", "b"], "n": 2, "max_tokens": 1})
    assert r.status_code == 200, r.text


# --- backpressure, deadlines, drain: requests in flight at once ----------------------------


def _run(stack: FakeStack, coro_fn) -> Any:
    async def main() -> Any:
        await stack.tokenizer_manager.start()
        try:
            transport = httpx.ASGITransport(app=stack.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                return await coro_fn(c)
        finally:
            await stack.tokenizer_manager.stop()
    return asyncio.run(main())


async def _until(cond, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


def test_queue_limit_answers_429_with_retry_after() -> None:
    with fake_stack(context_len=256, token_delay=0.05) as stack:
        adm = stack.tokenizer_manager.admission
        adm.max_running, adm.max_queued = 1, 1
        long = {"prompt": "a", "max_tokens": 200, "ignore_eos": True}

        async def scenario(c: httpx.AsyncClient) -> tuple[httpx.Response, str, list[int]]:
            held = [asyncio.create_task(c.post("/v1/completions", json=long))
                    for _ in range(2)]
            await _until(lambda: stack.tokenizer_manager.num_running == 2)
            over = await c.post("/v1/completions", json={"prompt": "b", "max_tokens": 1})
            metrics = (await c.get("/metrics")).text
            for t in held:
                t.cancel()
            await asyncio.gather(*held, return_exceptions=True)
            return over, metrics, []

        over, metrics, _ = _run(stack, scenario)
        err = error_of(over, 429)
        assert err["type"] == "rate_limit_error" and over.headers["retry-after"] == "1"
        assert "radixlm_rejected_queue_full_total" in metrics
        line = [x for x in metrics.splitlines()
                if x.startswith("radixlm_rejected_queue_full_total")][0]
        assert float(line.split()[-1]) == 1.0
        assert "radixlm_api_queued_requests" in metrics
        # The two cancelled requests were aborted in the engine: nothing stays in flight.
        assert stack.engine.wait_aborted(2)
        assert stack.tokenizer_manager.num_running == 0


@pytest.mark.parametrize("stream", [False, True])
def test_deadline_aborts_the_request_in_the_engine(stream: bool) -> None:
    # The fake engine sends one token every 50 ms; 200 tokens would take 10 s.
    with fake_stack(context_len=256, token_delay=0.05) as stack:
        body = {"prompt": "a", "max_tokens": 200, "ignore_eos": True, "timeout": 0.3,
                "stream": stream}

        async def scenario(c: httpx.AsyncClient) -> httpx.Response:
            return await c.post("/v1/completions", json=body)

        r = _run(stack, scenario)
        if stream:
            assert r.status_code == 200
            events = [e.removeprefix("data: ") for e in r.text.split("\n\n") if e]
            assert events[-1] == "[DONE]"
            err = json.loads(events[-2])["error"]
            assert err["code"] == 408 and "timed out after 0.3 s" in err["message"]
        else:
            err = error_of(r, 408)
            assert err["type"] == "timeout_error" and "timed out" in err["message"]
        (rid,) = [m.rid for m in stack.engine.received]
        assert stack.engine.wait_aborted(1) and stack.engine.aborted == [rid]
        assert stack.tokenizer_manager.requests_timed_out_total == 1 and stack.tokenizer_manager.num_running == 0


def test_draining_refuses_new_requests_and_health() -> None:
    with fake_stack(context_len=256) as stack:
        stack.tokenizer_manager.admission.draining = True

        async def scenario(c: httpx.AsyncClient) -> tuple[httpx.Response, httpx.Response]:
            return (await c.post("/v1/completions", json={"prompt": "a", "max_tokens": 1}),
                    await c.get("/health"))

        new, health = _run(stack, scenario)
        assert "shutting down" in error_of(new, 503)["message"]
        error_of(health, 503)
        assert stack.engine.received == []
