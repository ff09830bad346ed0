"""The Responses API (/v1/responses) on the real server (default model) through the
official `openai` client and the OpenAI Agents SDK: a plain answer, the typed stream (event
types, order, sequence numbers), a function-tool round trip continued with
previous_response_id, text.format json_schema, GET/DELETE, 400s naming unsupported fields,
404 for an unknown id; the KV pool is free after each test."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from tests.conftest import requires_default_model

pytestmark = [pytest.mark.slow, requires_default_model,
              pytest.mark.usefixtures("pool_invariant")]
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 20}}, "required": ["city"],
               "additionalProperties": False}}
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 16},
    "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"]}


@pytest.fixture(scope="module")
def server(default_server: str) -> str:
    """The session's shared default-model server (e2e/conftest.py), whose
    --responses-store-size 4 the eviction test relies on."""
    return default_server


def test_plain_response_and_store(client: Any, server: str) -> None:
    r = client.responses.create(model="m", input="What is the capital of France?",
                                instructions="Answer in one word.", max_output_tokens=8,
                                temperature=0)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status in ("completed", "incomplete")
    assert r.output[0].type == "message" and r.output_text
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 8
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.input_tokens_details.cached_tokens >= 0
    # Stored: GET returns it; the same prompt again hits the radix cache.
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text
    again = client.responses.create(model="m", input="What is the capital of France?",
                                    instructions="Answer in one word.", max_output_tokens=8,
                                    temperature=0, store=False)
    assert again.output_text == r.output_text
    assert again.usage.input_tokens_details.cached_tokens > 0
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(again.id)  # store false: not kept
    deleted = httpx.delete(server + f"/v1/responses/{r.id}", timeout=30)
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_incomplete_at_max_output_tokens(client: Any) -> None:
    r = client.responses.create(model="m", input="Count from 1 to 100.", max_output_tokens=3,
                                temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3


def test_streaming_events_in_order(client: Any) -> None:
    kinds, seqs, deltas = [], [], []
    done_text, final = None, None
    with client.responses.stream(model="m", input="Say hello.", max_output_tokens=12,
                                 temperature=0) as stream:
        for ev in stream:
            kinds.append(ev.type)
            seqs.append(ev.sequence_number)
            if ev.type == "response.output_text.delta":
                deltas.append(ev.delta)
            elif ev.type == "response.output_text.done":
                done_text = ev.text
            elif ev.type in ("response.completed", "response.incomplete"):
                final = ev.response
    assert seqs == list(range(len(seqs)))
    head = ["response.created", "response.in_progress", "response.output_item.added",
            "response.content_part.added"]
    assert kinds[:4] == head, kinds
    n = len(deltas)
    assert n >= 1 and kinds[4:4 + n] == ["response.output_text.delta"] * n
    assert kinds[4 + n:] == ["response.output_text.done", "response.content_part.done",
                             "response.output_item.done", kinds[-1]]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert done_text == "".join(deltas) == final.output_text
    assert final.usage.output_tokens == n or final.usage.output_tokens >= 1


def test_stream_past_its_timeout_fails_with_the_requests_own_code(client: Any) -> None:
    """A request's own `timeout` (radixlm's extension) ends the stream with
    response.failed whose code names the timeout, not a server error."""
    kinds, failed = [], None
    with client.responses.stream(model="m", input="Count from 1 to 100.", temperature=0,
                                 max_output_tokens=200, extra_body={"timeout": 1e-6}) as stream:
        for ev in stream:
            kinds.append(ev.type)
            if ev.type == "response.failed":
                failed = ev.response
    assert kinds[-1] == "response.failed", kinds
    assert failed.status == "failed" and failed.error.code == "timeout_error"


def test_function_tool_round_trip(client: Any) -> None:
    r = client.responses.create(
        model="m", input="What is the weather in Paris?", tools=[WEATHER],
        tool_choice="required", parallel_tool_calls=False, temperature=0,
        max_output_tokens=64)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    follow = client.responses.create(
        model="m", previous_response_id=r.id, tools=[WEATHER], tool_choice="none",
        temperature=0, max_output_tokens=16,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                "output": "Sunny, 21 degrees"}])
    assert follow.previous_response_id == r.id
    assert follow.output[0].type == "message" and follow.output_text
    # The follow-up saw the whole conversation: the question, the call and its output.
    alone = client.responses.create(model="m", input="What is the weather in Paris?",
                                    max_output_tokens=1, store=False)
    assert follow.usage.input_tokens > alone.usage.input_tokens + 10
    # Without the stored turn, the call's output has no call to answer: a 400.
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="m", max_output_tokens=4, input=[
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "x"}])


def test_streamed_function_call(client: Any) -> None:
    kinds, args = [], ""
    with client.responses.stream(model="m", input="Weather in Rome?", tools=[WEATHER],
                                 tool_choice={"type": "function", "name": "get_weather"},
                                 temperature=0, max_output_tokens=64) as stream:
        for ev in stream:
            kinds.append(ev.type)
            if ev.type == "response.function_call_arguments.delta":
                args += ev.delta
            if ev.type == "response.function_call_arguments.done":
                assert ev.arguments == args
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    added = kinds.index("response.output_item.added")
    assert kinds.index("response.function_call_arguments.done") > added
    assert kinds[-2:] == ["response.output_item.done", "response.completed"]
    (call,) = [o for o in final.output if o.type == "function_call"]
    assert call.arguments == args
    jsonschema.validate(json.loads(args), WEATHER["parameters"])


def test_text_format_json_schema(client: Any) -> None:
    r = client.responses.create(
        model="m", input="A person as JSON.", temperature=0, max_output_tokens=64,
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON,
                         "strict": True}})
    jsonschema.validate(json.loads(r.output_text), PERSON)
    assert r.text.format.type == "json_schema"


@pytest.mark.parametrize("extra, param", [
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"background": True}, "background"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0].type"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    # Checked on the chat path, named as the Responses API spells it.
    ({"text": {"format": {"type": "json_schema", "name": "x",
                          "schema": {"type": "no-such-type"}}}}, "text.format.schema"),
])
def test_unsupported_fields_are_400(client: Any, extra: dict, param: str) -> None:
    body = {"model": "m", "input": "hi", "max_output_tokens": 2, **extra}
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(**body)
    err = e.value.body
    assert err["param"] == param and param.split("[")[0].split(".")[0] in err["message"], err
    assert "response_format" not in err["message"], err


def test_unknown_ids_are_404(client: Any, server: str) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="m", input="hi", previous_response_id="resp_nope")
    assert e.value.body["param"] == "previous_response_id"
    assert "resp_nope" in e.value.body["message"]
    r = httpx.get(server + "/v1/responses/resp_nope", timeout=30)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert httpx.delete(server + "/v1/responses/resp_nope", timeout=30).status_code == 404


def test_store_is_a_bounded_lru(client: Any) -> None:
    ids = [client.responses.create(model="m", input=f"Say {i}.", max_output_tokens=1).id
           for i in range(5)]  # --responses-store-size 4
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(ids[0])
    assert client.responses.retrieve(ids[4]).id == ids[4]


def test_agents_sdk_runs_an_agent_with_a_function_tool(server: str) -> None:
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    agents.set_default_openai_client(openai.AsyncOpenAI(base_url=server + "/v1", api_key="x",
                                                        max_retries=0),
                                     use_for_tracing=False)
    agents.set_default_openai_api("responses")
    seen: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather of a city."""
        seen.append(city)
        return f"Sunny in {city}"

    # The 135M model does not choose tools reliably: tool_choice "required" makes it call
    # the tool, and the run ends with the tool's result (the SDK's own run loop does both).
    agent = agents.Agent(name="weather", instructions="Use the tool to answer.",
                         tools=[get_weather], tool_use_behavior="stop_on_first_tool",
                         model_settings=agents.ModelSettings(tool_choice="required",
                                                             temperature=0, max_tokens=64))
    result = asyncio.run(agents.Runner.run(agent, "What is the weather in Paris?"))
    assert len(seen) == 1
    assert result.final_output == f"Sunny in {seen[0]}"
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item"], kinds
