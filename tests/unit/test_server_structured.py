"""The HTTP layer's structured-output paths over the fake engine: the constraint reaches
the scheduler, and a grammar that fails in the scheduler (compile error or timeout) is a
real HTTP 400 -- streamed or not, on every route -- while the server stays healthy."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from radixlm.server.testing import FAKE_COMPILE_ERROR, fake_stack


@pytest.fixture()
def stack():
    with fake_stack() as s, TestClient(s.app) as client:
        s.client = client
        yield s


CHAT = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route, body", [
    ("/v1/completions", {"prompt": "hello", "regex": FAKE_COMPILE_ERROR}),
    ("/v1/chat/completions", {"messages": CHAT, "guided_regex": FAKE_COMPILE_ERROR}),
    ("/generate", {"text": "hello", "sampling_params": {"regex": FAKE_COMPILE_ERROR}}),
])
def test_scheduler_side_grammar_failure_is_400(stack, route, body, stream) -> None:
    r = stack.client.post(route, json={**body, "max_tokens": 4, "stream": stream})
    assert r.status_code == 400, r.text
    assert "fake compile error" in r.json()["error"]["message"]
    assert stack.client.get("/health").status_code == 200


def test_constraint_reaches_the_scheduler(stack) -> None:
    r = stack.client.post("/v1/chat/completions", json={
        "messages": CHAT, "max_tokens": 3, "stream": True,
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object"}}}})
    assert r.status_code == 200 and "data: [DONE]" in r.text
    (req,) = stack.engine.received
    c = req.sampling_params.constraint
    assert c.kind == "json_schema" and c.field == "response_format.json_schema.schema"


def test_tool_choice_required_sends_the_call_schema(stack) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}}}}
    r = stack.client.post("/v1/chat/completions", json={
        "messages": CHAT, "max_tokens": 3, "tools": [tool], "tool_choice": "required"})
    assert r.status_code == 200
    c = stack.engine.received[-1].sampling_params.constraint
    assert c.field == "tool_choice" and '"const": "f"' in c.spec
