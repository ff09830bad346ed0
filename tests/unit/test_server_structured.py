"""The HTTP layer's structured-output paths over the fake engine: the constraint reaches
the scheduler, and a grammar that fails in the scheduler (compile error or timeout) is a
real HTTP 400 -- streamed or not, on every route -- while the server stays healthy."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.server_fakes import FAKE_COMPILE_ERROR, fake_stack


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


# --- tool_choice auto through the official openai client, on canned model outputs --------

openai = pytest.importorskip("openai")
from tests.unit.test_tool_parsers import ADD, CANNED, WEATHER  # noqa: E402


def _client(stack):
    return openai.OpenAI(base_url="http://testserver/v1", api_key="x", max_retries=0,
                         http_client=stack.client)


@pytest.mark.parametrize("parser, text, content, calls", CANNED)
def test_auto_tool_calls_through_the_openai_client(parser, text, content, calls) -> None:
    with fake_stack(context_len=1024) as s, TestClient(s.app) as http:
        s.tokenizer_manager.args = s.tokenizer_manager.args.replace(tool_call_parser=parser)
        s.client = http
        s.engine.canned_text = text
        client = _client(s)
        kw = dict(model="tiny", messages=CHAT, tools=[WEATHER, ADD], max_tokens=200)
        whole = client.chat.completions.create(**kw).choices[0]
        got = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []]
        assert got == calls
        assert whole.finish_reason == ("tool_calls" if calls else "stop")
        assert whole.message.content == content
        streamed: dict[int, list[str]] = {}
        streamed_content, finish = "", None
        for chunk in client.chat.completions.create(stream=True, **kw):
            ch = chunk.choices[0]
            finish = ch.finish_reason or finish
            streamed_content += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                if tc.index not in streamed:
                    assert tc.id and tc.type == "function" and tc.function.name
                    streamed[tc.index] = [tc.function.name, ""]
                streamed[tc.index][1] += tc.function.arguments or ""
        assert [tuple(v) for _, v in sorted(streamed.items())] == got
        assert finish == whole.finish_reason
        if calls:
            assert streamed_content.strip() == (content or "")
        else:
            assert streamed_content == text
