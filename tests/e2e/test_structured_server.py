"""Structured output and tool calling through the real server (default model) with the
official `openai` client and LangChain's ChatOpenAI: schema outputs validate, required /
named tool choice return parseable calls, streamed tool-call deltas reassemble to the
non-streamed answer, bad constraints are 400s naming the field, /metrics shows the
grammar and jump-forward counters, and after every test the pool invariant holds."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from tests.conftest import requires_default_model

pytestmark = [pytest.mark.slow, requires_default_model,
              pytest.mark.usefixtures("pool_invariant")]
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": -1000, "maximum": 1000},
        "b": {"type": "integer", "minimum": -1000, "maximum": 1000}}, "required": ["a", "b"]}}}
TOOLS = [WEATHER, ADD]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 16},
    "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"]}


@pytest.fixture(scope="module")
def server(default_server: str) -> str:
    return default_server  # the session's shared default-model server (e2e/conftest.py)

def _check_call(call: Any, tools: list[dict]) -> None:
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in by_name
    jsonschema.validate(json.loads(call.function.arguments), by_name[call.function.name])


# --- response_format and the other dialects ------------------------------------------------


def test_json_schema_chat_and_n2(client: Any) -> None:
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "A person as JSON."}], n=2, seed=5,
        temperature=1.0, max_tokens=64,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    assert len(r.choices) == 2
    for ch in r.choices:
        assert ch.finish_reason == "stop"
        jsonschema.validate(json.loads(ch.message.content), PERSON)


def test_streamed_json_and_completions_dialects(client: Any, server: str) -> None:
    text = ""
    for chunk in client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "A person as JSON."}],
            max_tokens=64, temperature=0, stream=True,
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
    jsonschema.validate(json.loads(text), PERSON)
    r = client.chat.completions.create(
        model="m", max_tokens=160, temperature=0, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": 'Answer with the JSON object {"ok": true}.'}])
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    r = client.completions.create(model="m", prompt="Pick:", max_tokens=8, temperature=0,
                                  extra_body={"guided_choice": ["alpha", "beta"]})
    assert r.choices[0].text in ("alpha", "beta")
    r = client.completions.create(model="m", prompt="Code:", max_tokens=16, temperature=0,
                                  logprobs=3, extra_body={"regex": "[A-Z]{3}-[0-9]{2}"})
    assert re.fullmatch("[A-Z]{3}-[0-9]{2}", r.choices[0].text), r.choices[0].text
    body = httpx.post(server + "/generate", timeout=120, json={
        "text": "Say yes or no:", "sampling_params": {
            "max_new_tokens": 8, "temperature": 0, "ebnf": 'root ::= "yes" | "no"'}}).json()
    assert body["text"] in ("yes", "no") and body["meta_info"]["finish_reason"]["type"] == "stop"


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                          "schema": {"type": "foo"}}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "guided_regex"),
    ({"regex": "(("}, "regex"),
    ({"structured_outputs": {"grammar": "root ::= "}}, "structured_outputs.grammar"),
    ({"json_schema": {"type": "array", "uniqueItems": True}}, "json_schema"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "tool_choice"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_bad_constraints_are_400(server: str, extra: dict, param: str, stream: bool) -> None:
    r = httpx.post(server + "/v1/chat/completions", timeout=60, json={
        "model": "m", "messages": ASK, "max_tokens": 4, "stream": stream, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


# --- tools ---------------------------------------------------------------------------------


def test_required_and_named_tool_choice(client: Any) -> None:
    r = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, temperature=0,
                                       tool_choice="required", max_tokens=96)
    (ch,) = r.choices
    assert ch.finish_reason == "tool_calls" and ch.message.tool_calls
    for call in ch.message.tool_calls:
        _check_call(call, TOOLS)
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Add 2 and 3."}], tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "add"}}, max_tokens=96,
        temperature=0)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "add"
    _check_call(call, TOOLS)


def test_streamed_tool_calls_reassemble(client: Any) -> None:
    kw = dict(model="m", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=96,
              temperature=0, parallel_tool_calls=False)
    whole = client.chat.completions.create(**kw).choices[0]
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kw):
        ch = chunk.choices[0]
        finish = ch.finish_reason or finish
        assert not ch.delta.content
        for tc in ch.delta.tool_calls or []:
            if tc.index not in calls:
                assert tc.id and tc.type == "function" and tc.function.name
                calls[tc.index] = {"name": tc.function.name, "arguments": ""}
            calls[tc.index]["arguments"] += tc.function.arguments or ""
    assert finish == "tool_calls" == whole.finish_reason
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls]


def test_metrics_show_grammar_counters(server: str) -> None:
    text = httpx.get(server + "/metrics", timeout=30).text
    for name in ("radixlm_grammar_compile_seconds_total", "radixlm_grammar_cache_hits_total",
                 "radixlm_grammar_queue_wait_seconds_total", "radixlm_grammar_mask_seconds_total",
                 "radixlm_grammar_constrained_row_share"):
        assert name in text


def _metric(server: str, name: str, present: bool = True) -> float:
    """A /metrics value; absent (no constrained request yet) reads 0 unless `present`."""
    text = httpx.get(server + "/metrics", timeout=30).text
    found = re.search(rf"^{name}(?:\{{[^}}]*\}})? ([0-9.e+]+)$", text, re.M)
    assert found or not present, name
    return float(found.group(1)) if found else 0.0


def test_jump_forward_json_schema_streamed_equals_whole(client: Any, server: str) -> None:
    """Jump-forward is on by default: the schema's fixed spans are jumped (the /metrics
    counter grows), the JSON validates, streamed text == non-streamed, and a request with
    logprobs jumps too and has one logprob per token."""
    before = _metric(server, "radixlm_jump_forward_tokens_total", present=False)
    kw = dict(model="m", messages=[{"role": "user", "content": "A person as JSON."}],
              max_tokens=64, temperature=0, response_format={
                  "type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}})
    whole = client.chat.completions.create(**kw)
    jsonschema.validate(json.loads(whole.choices[0].message.content), PERSON)
    text = "".join(c.choices[0].delta.content or "" for c in
                   client.chat.completions.create(stream=True, **kw) if c.choices)
    assert text == whole.choices[0].message.content
    mid = _metric(server, "radixlm_jump_forward_tokens_total")
    assert mid > before
    lp = client.chat.completions.create(logprobs=True, top_logprobs=2, **kw)
    jsonschema.validate(json.loads(lp.choices[0].message.content), PERSON)
    assert len(lp.choices[0].logprobs.content) == lp.usage.completion_tokens
    assert all(t.logprob <= 0 for t in lp.choices[0].logprobs.content)
    assert _metric(server, "radixlm_jump_forward_tokens_total") > mid


# --- LangChain -----------------------------------------------------------------------------


def _chat_model(server: str) -> Any:
    lc = pytest.importorskip("langchain_openai")
    return lc.ChatOpenAI(base_url=server + "/v1", api_key="x", model="m", temperature=0,
                         max_tokens=96, timeout=300, max_retries=0)


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_structured_output(server: str, method: str) -> None:
    from pydantic import BaseModel, Field

    class City(BaseModel):
        """A city and its country."""
        name: str = Field(max_length=20)
        country: str = Field(max_length=20)
        population_millions: int = Field(ge=0, le=100)

    out = _chat_model(server).with_structured_output(City, method=method).invoke(
        "Describe Paris.")
    assert isinstance(out, City)


def test_langchain_bind_tools_named(server: str) -> None:
    from langchain_core.tools import tool

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    msg = _chat_model(server).bind_tools([add], tool_choice="add").invoke("What is 2 plus 3?")
    (call,) = msg.tool_calls
    assert call["name"] == "add" and set(call["args"]) == {"a", "b"}
    assert all(isinstance(v, int) for v in call["args"].values())
