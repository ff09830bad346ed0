"""Tool-call parsers on canned model outputs, streamed in every split and not: the
streamed deltas reassemble to the non-streamed answer, the first delta of a call carries
index/id/type/name, a partial start tag never leaks as content, and the chunks validate
as the official openai client's types."""

from __future__ import annotations

import json
import random

import pytest

from radixlm.constrained.constraint import ConstraintError
from radixlm.server.tool_parsers import PARSERS, default_parser_name, load_template, make_parser
from radixlm.server.tools import ToolDeltas, plan_tools, tool_message

openai_types = pytest.importorskip("openai.types.chat")

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}

# (parser, model output, expected content, expected [(name, arguments)])
CANNED = [
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
               '"Paris"}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, '
               '"b": 2}}\n</tool_call>',
     "Let me check.", [("get_weather", '{"city": "Paris"}'), ("add", '{"a": 1, "b": 2}')]),
    ("qwen25", '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": {"x": "<}>"}}}\n'
               '</tool_call>', None, [("add", '{"a": 3, "b": {"x": "<}>"}}')]),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Rome"}}', None,
     [("get_weather", '{"city": "Rome"}')]),
    ("llama3_json", '<|python_tag|>{"name": "add", "parameters": {"a": 1}}; '
                    '{"name": "get_weather", "parameters": {"city": "Oslo"}}', None,
     [("add", '{"a": 1}'), ("get_weather", '{"city": "Oslo"}')]),
    ("smollm2", '<tool_call>[{"name": "get_weather", "arguments": {"city": "Lyon"}}, '
                '{"name": "add", "arguments": {"a": 5, "b": 6}}]</tool_call>', None,
     [("get_weather", '{"city": "Lyon"}'), ("add", '{"a": 5, "b": 6}')]),
    ("hermes", "No tools needed: 1 < 2 and <tool> is not a tag.", "No tools needed: 1 < 2 and "
               "<tool> is not a tag.", []),
    ("llama3_json", "The weather is fine.", "The weather is fine.", []),
    ("smollm2", '<tool_call>[{"name": "ad', '<tool_call>[{"name": "ad', []),  # no name: text
]


def _plan(parser: str):
    return plan_tools([WEATHER, ADD], "auto", None, "no template", parser)


def _splits(text: str, seed: int) -> list[str]:
    rng, out, i = random.Random(seed), [], 0
    while i < len(text):
        k = rng.randint(1, 6)
        out.append(text[i:i + k])
        i += k
    return out


@pytest.mark.parametrize("parser, text, content, calls", CANNED)
def test_non_streaming(parser: str, text: str, content: str | None, calls) -> None:
    message, has_calls = tool_message(_plan(parser), text)
    assert has_calls == bool(calls)
    got = [(c["function"]["name"], c["function"]["arguments"])
           for c in message.get("tool_calls", [])]
    assert got == calls
    assert message["content"] == content
    for c in message.get("tool_calls", []):
        assert c["type"] == "function" and c["id"].startswith("call_")
        json.loads(c["function"]["arguments"])
    openai_types.ChatCompletionMessage.model_validate(message)


def test_cut_off_arguments_stay_cut_off_in_both_modes() -> None:
    """max_tokens ends the answer inside a call's arguments: the call is reported (its
    name was complete) with the arguments generated so far, streamed or not."""
    text = '<tool_call>[{"name": "add", "arguments": {"a": 1,'
    plan = _plan("smollm2")
    _, calls = plan.parse(text)
    assert [(c.name, c.arguments) for c in calls] == [("add", '{"a": 1,')]
    td = ToolDeltas(plan.stream())
    deltas = [td.feed(p, final=i == 2) for i, p in enumerate([text[:20], text[20:35], text[35:]])]
    args = "".join(tc["function"]["arguments"] for d in deltas for tc in d.get("tool_calls", []))
    assert args == '{"a": 1,' and not any("content" in d for d in deltas)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("parser, text, content, calls", [c for c in CANNED if c[3]])
def test_streaming_reassembles(parser: str, text: str, content, calls, seed: int) -> None:
    td = ToolDeltas(_plan(parser).stream())
    pieces = _splits(text, seed)
    got: dict[int, dict] = {}
    streamed_content = ""
    for n, piece in enumerate(pieces):
        delta = td.feed(piece, final=n == len(pieces) - 1)
        openai_types.ChatCompletionChunk.model_validate({
            "id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
        streamed_content += delta.get("content", "")
        for tc in delta.get("tool_calls", []):
            if tc["index"] not in got:  # the first delta of a call: everything but args
                assert tc["id"].startswith("call_") and tc["type"] == "function"
                assert tc["function"]["name"]
                got[tc["index"]] = {"name": tc["function"]["name"], "arguments": ""}
            else:
                assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
            got[tc["index"]]["arguments"] += tc["function"]["arguments"]
    assert [(got[i]["name"], got[i]["arguments"]) for i in sorted(got)] == calls
    assert streamed_content.strip() == (content or "")


@pytest.mark.parametrize("parser", ["hermes", "smollm2"])
def test_no_partial_tag_leaks(parser: str) -> None:
    td = ToolDeltas(_plan(parser).stream())
    sent = ""
    for piece in ["Sure", " <", "tool", "_ca", "ll>", '{"name": "add", "arguments": {}}']:
        delta = td.feed(piece)
        sent += delta.get("content", "")
        assert "<" not in sent, "a partial start tag was sent as content"
    assert sent == "Sure "
    # Text that only looked like a tag start is released.
    td = ToolDeltas(_plan(parser).stream())
    assert td.feed("a <").get("content") == "a "
    assert td.feed("b").get("content") == "<b"
    assert td.feed(" <tool_", final=True).get("content") == " <tool_"


def test_registry_and_defaults() -> None:
    assert {"hermes", "qwen25", "llama3_json", "smollm2"} <= set(PARSERS)
    with pytest.raises(ValueError, match="unknown --tool-call-parser"):
        make_parser("nope")
    assert default_parser_name("... <|python_tag|> ...") == "llama3_json"
    assert default_parser_name("Qwen ... <tool_call>") == "qwen25"
    assert default_parser_name("<|im_start|>") == "smollm2"
    assert "<tool_call>" in load_template("smollm2_tools.jinja")


def test_smollm2_template_renders_tools_and_history() -> None:
    from jinja2 import Environment

    plan = _plan("smollm2")
    assert plan.chat_template is not None  # "no template" renders no tools
    env = Environment()
    env.filters["tojson"] = lambda v: json.dumps(v)
    text = env.from_string(plan.chat_template).render(messages=[
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "1"}],
        tools=plan.template_tools, add_generation_prompt=True)
    assert '"name": "get_weather"' in text and "<tools>" in text
    assert '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_call>' in text
    assert "<|im_start|>tool\nsunny<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_forced_plans() -> None:
    req = plan_tools([WEATHER, ADD], "required", False, None, None)
    schema = json.loads(req.constraint.spec)
    assert req.mode == "forced" and schema["maxItems"] == 1 and len(schema["items"]["anyOf"]) == 2
    named = plan_tools([WEATHER, ADD], {"type": "function", "function": {"name": "add"}}, None,
                       None, None)
    schema = json.loads(named.constraint.spec)
    assert schema["items"]["properties"]["name"]["const"] == "add" and schema["maxItems"] == 1
    content, calls = named.parse('[{"name": "add", "arguments": {"a": 1, "b": 2}}]')
    assert content == "" and calls[0].arguments == '{"a": 1, "b": 2}'
    assert plan_tools(None, None, None, None, None).mode == "none"
    assert plan_tools([WEATHER], "none", None, None, None).mode == "none"


@pytest.mark.parametrize("tools, choice, param", [
    ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
    ([WEATHER], "sometimes", "tool_choice"),
    (None, "required", "tool_choice"),
    ([{"type": "retrieval"}], "auto", "tools"),
    ([{"type": "function", "function": {"name": "bad name!"}}], "auto", "tools"),
    ([WEATHER, WEATHER], "auto", "tools"),
    ([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "not": {}}}}], "required", "tools[0].function.parameters"),
])
def test_bad_tool_fields(tools, choice, param) -> None:
    with pytest.raises(ConstraintError) as e:
        plan_tools(tools, choice, None, None, None)
    assert e.value.param == param
