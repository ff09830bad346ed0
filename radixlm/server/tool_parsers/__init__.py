"""Tool-call parsers, a registry by name (`--tool-call-parser`)."""

from __future__ import annotations

from importlib import resources

from radixlm.server.tool_parsers.base import ToolCall, ToolCallStream, ToolParser, new_call_id
from radixlm.server.tool_parsers.formats import (HermesParser, Llama3JsonParser, Qwen25Parser,
                                                 SmolLM2Parser)

PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (HermesParser, Qwen25Parser, Llama3JsonParser, SmolLM2Parser)}

__all__ = ["PARSERS", "ToolCall", "ToolCallStream", "ToolParser", "default_parser_name",
           "load_template", "make_parser", "new_call_id"]


def make_parser(name: str) -> ToolParser:
    try:
        return PARSERS[name]()
    except KeyError:
        raise ValueError(f"unknown --tool-call-parser {name!r}; choose from "
                         f"{', '.join(sorted(PARSERS))}") from None


def default_parser_name(chat_template: str | None) -> str:
    """The parser a chat template implies: Llama 3.x and Hermes/Qwen templates say which
    format they render; a template that renders no tools (SmolLM2's ChatML) gets ours."""
    t = chat_template or ""
    if "<|python_tag|>" in t or "<|eom_id|>" in t:
        return "llama3_json"
    if "<tool_call>" in t:
        return "qwen25" if "Qwen" in t else "hermes"
    return "smollm2"


def load_template(file_name: str) -> str:
    return resources.files("radixlm.server.tool_parsers").joinpath(
        "templates", file_name).read_text()
