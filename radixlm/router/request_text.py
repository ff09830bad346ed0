"""The text a request is routed by: what the worker will put at the front of its prompt. The
router has no tokenizer, so it routes on text (token-id prompts become their ids written
out, which keeps the prefix property: a shared id prefix is a shared text prefix). Chat
messages are rendered role by role in order; the model's real chat template adds its own
markers around them, which is the same for every request, so prefixes that agree here
agree there. A Responses API request renders as the chat request it becomes (its
`instructions` a system message first, then its input items). A list of prompts routes by
its first prompt (one worker serves the whole request). Malformed bodies give "": the
worker answers them with its own 400.
"""

from __future__ import annotations

from typing import Any


def _ids_text(ids: list[Any]) -> str:
    return " ".join(str(i) for i in ids)


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, str):
            return first
        if isinstance(first, list):
            return _ids_text(first)
        return _ids_text(prompt)
    return ""


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        return "\n".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return ""


def chat_text(messages: Any) -> str:
    if not isinstance(messages, list):
        return ""
    parts = []
    for m in messages:
        if isinstance(m, dict):
            parts.append(f"<{m.get('role', '')}>{_content_text(m.get('content'))}\n")
    return "".join(parts)


def responses_text(body: dict[str, Any]) -> str:
    """/v1/responses: `instructions`, then `input` (a string, or items: messages with a
    role, tool calls and their outputs), as chat_text renders the same chat request."""
    parts = []
    if isinstance(body.get("instructions"), str):
        parts.append(f"<system>{body['instructions']}\n")
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        if "role" in item:
            parts.append(f"<{item['role']}>{_content_text(item.get('content'))}\n")
        else:  # function_call / function_call_output
            text = item.get("output") or item.get("arguments") or ""
            parts.append(f"<{item.get('type', '')}>{text if isinstance(text, str) else ''}\n")
    return "".join(parts)


def routing_text(path: str, body: Any) -> str:
    """Routing text of a parsed JSON `body` sent to `path`."""
    if not isinstance(body, dict):
        return ""
    if path == "/v1/chat/completions":
        return chat_text(body.get("messages"))
    if path == "/v1/completions":
        return _prompt_text(body.get("prompt"))
    if path == "/v1/responses":
        return responses_text(body)
    if path == "/generate":
        if body.get("text") is not None:
            return _prompt_text(body["text"])
        return _prompt_text(body.get("input_ids"))
    return ""
