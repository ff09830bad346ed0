"""The tool-call formats we parse (one class each; registered in `__init__.py`)."""

from __future__ import annotations

from radixlm.server.tool_parsers.base import ToolParser


class HermesParser(ToolParser):
    """Hermes / Qwen2.5: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
    one tag per call; Qwen2.5's template renders the tools itself."""

    name = "hermes"
    start_markers = ("<tool_call>",)


class Qwen25Parser(HermesParser):
    name = "qwen25"


class Llama3JsonParser(ToolParser):
    """Llama 3.1-3.3 JSON tool calling: the answer is `{"name": ..., "parameters": {...}}`
    (optionally after `<|python_tag|>`), several separated by `;`."""

    name = "llama3_json"
    start_markers = ("<|python_tag|>", "{")
    at_start_only = True


class SmolLM2Parser(ToolParser):
    """SmolLM2-Instruct: a JSON array of `{"name", "arguments"}` objects inside
    `<tool_call>` tags. Its chat template renders no tools, so we ship one that lists
    them in the system prompt (`templates/smollm2_tools.jinja`)."""

    name = "smollm2"
    start_markers = ("<tool_call>",)
    fallback_template = "smollm2_tools.jinja"
