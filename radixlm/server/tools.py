"""Tool calling on /v1/chat/completions: `tools`, `tool_choice`, `parallel_tool_calls`.

`plan_tools` decides, per request:
  * tool_choice "none" (the default without tools): the template gets no tools, the
    answer is plain content;
  * "auto" (the default with tools): free generation, parsed afterwards by the
    `--tool-call-parser` (radixlm/server/tool_parsers/);
  * "required" or a named function: generation is constrained to a JSON array of
    `{"name", "arguments"}` objects (one schema per allowed tool, `anyOf`; a single call
    when `parallel_tool_calls` is false or a function is named), and the array is the
    answer's tool calls.
A call's `arguments` is the raw JSON text the model generated for them; `finish_reason`
is "tool_calls" when the answer has calls.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from radixlm.constrained.constraint import Constraint, ConstraintError
from radixlm.constrained.validate import parse_json_schema
from radixlm.server.tool_parsers import (ToolCall, ToolCallStream, ToolParser, default_parser_name,
                                         load_template, make_parser, new_call_id)
from radixlm.server.tool_parsers.base import parse_with

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


@dataclass
class ToolPlan:
    mode: str  # "none" | "auto" | "forced"
    template_tools: list[dict[str, Any]] | None = None  # what the chat template renders
    chat_template: str | None = None  # overrides the model's (it renders no tools)
    constraint: Constraint | None = None  # forced: the JSON array of calls
    parser: ToolParser | None = None  # auto

    def stream(self) -> ToolCallStream | None:
        if self.mode == "forced":
            return ToolCallStream(None, region_from_start=True)
        if self.mode == "auto":
            assert self.parser is not None
            return self.parser.stream()
        return None

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        stream = self.stream()
        if stream is None:
            return text, []
        return parse_with(stream, text)


def _function(tool: Any, i: int) -> dict[str, Any]:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise ConstraintError(f"{where}: only tools of type 'function' are supported", "tools")
    fn = tool.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) \
            or not _NAME.match(fn["name"]):
        raise ConstraintError(f"{where}.function.name must be 1-64 letters, digits, '_', '.' "
                              "or '-'", "tools")
    params = fn.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise ConstraintError(f"{where}.function.parameters must be a JSON schema object",
                              "tools")
    return fn


def _call_schema(fn: dict[str, Any]) -> dict[str, Any]:
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "object",
            "properties": {"name": {"type": "string", "const": fn["name"]}, "arguments": params},
            "required": ["name", "arguments"]}


def plan_tools(tools: list[Any] | None, tool_choice: Any, parallel_tool_calls: bool | None,
               model_template: str | None, parser_name: str | None) -> ToolPlan:
    """Validate the tool fields (ConstraintError -> 400 naming the field) and plan."""
    fns = [_function(t, i) for i, t in enumerate(tools or [])]
    names = [f["name"] for f in fns]
    if len(set(names)) != len(names):
        raise ConstraintError("tools: function names must be unique", "tools")
    choice = tool_choice if tool_choice is not None else ("auto" if fns else "none")
    named: str | None = None
    if isinstance(choice, dict):
        fn = choice.get("function")
        if choice.get("type") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str):
            raise ConstraintError("tool_choice must be 'none', 'auto', 'required' or "
                                  '{"type": "function", "function": {"name": ...}}',
                                  "tool_choice")
        named = fn["name"]
        if named not in names:
            raise ConstraintError(f"tool_choice names function {named!r}, which is not in "
                                  "tools", "tool_choice")
    elif choice not in ("none", "auto", "required"):
        raise ConstraintError("tool_choice must be 'none', 'auto', 'required' or a named "
                              "function", "tool_choice")
    if choice == "none" or not fns:
        if choice not in ("none", "auto"):
            raise ConstraintError(f"tool_choice {choice!r} needs tools", "tool_choice")
        # As before tool calling: the model's own template sees the tools; nothing parsed.
        return ToolPlan("none", list(tools) if tools else None)

    for i, fn in enumerate(fns):  # refused here rather than ignored by the grammar
        if fn.get("parameters") is not None:
            parse_json_schema(fn["parameters"], f"tools[{i}].function.parameters")
    name = parser_name or default_parser_name(model_template)
    parser = make_parser(name)
    template = None
    if "tools" not in (model_template or "") and parser.fallback_template:
        template = load_template(parser.fallback_template)
    tools_for_template = [{"type": "function", "function": f} for f in fns]
    if choice == "auto":
        return ToolPlan("auto", tools_for_template, template, parser=parser)

    allowed = [f for f in fns if named is None or f["name"] == named]
    items = _call_schema(allowed[0]) if len(allowed) == 1 else {
        "anyOf": [_call_schema(f) for f in allowed]}
    schema: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
    if named is not None or parallel_tool_calls is False:
        schema["maxItems"] = 1
    spec = parse_json_schema(schema, "tool_choice")
    return ToolPlan("forced", tools_for_template, template,
                    constraint=Constraint("json_schema", spec, "tool_choice"))


@dataclass
class ToolDeltas:
    """Streaming: one choice's split of text deltas into content and tool-call deltas."""

    stream: ToolCallStream
    ids: dict[int, str] = field(default_factory=dict)

    @property
    def has_calls(self) -> bool:
        return bool(self.ids)

    def feed(self, text: str, final: bool = False) -> dict[str, Any]:
        """The OpenAI delta for `text` ({} when nothing is to be sent yet): content, and
        tool_calls whose first delta carries index, id, type and the function name, later
        ones the index and argument fragments."""
        content, events = self.stream.feed(text)
        if final:
            more, tail = self.stream.finish()
            content += more
            events += tail
        calls = []
        for e in events:
            if e.name is not None:
                self.ids[e.index] = new_call_id()
                calls.append({"index": e.index, "id": self.ids[e.index], "type": "function",
                              "function": {"name": e.name, "arguments": e.arguments}})
            elif e.arguments:
                calls.append({"index": e.index, "function": {"arguments": e.arguments}})
        delta: dict[str, Any] = {}
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = calls
        return delta


def tool_message(plan: ToolPlan, text: str) -> tuple[dict[str, Any], bool]:
    """The non-streamed assistant message, and whether it has tool calls."""
    content, calls = plan.parse(text)
    if not calls:
        return {"role": "assistant", "content": text}, False
    return {"role": "assistant", "content": content.strip() or None,
            "tool_calls": [c.to_openai() for c in calls]}, True

