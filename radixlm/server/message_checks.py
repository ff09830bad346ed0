"""Structural checks of a chat conversation, beyond the per-field types of protocol.py.

Rules (each a 400 naming the message):
  * every message has content, except an assistant message that carries tool_calls (or a
    function_call) instead;
  * a `tool` / `function` message answers a call: it follows an assistant message or
    another tool / function message, never the start of the conversation, a system or a
    user message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_ANSWERS = ("tool", "function")


def check_messages(messages: Sequence[Any]) -> None:
    """Raise ValueError for the first message that breaks a rule above."""
    prev: str | None = None
    for i, m in enumerate(messages):
        calls = getattr(m, "tool_calls", None) or getattr(m, "function_call", None)
        if m.content is None and not (m.role == "assistant" and calls):
            raise ValueError(f"messages.{i}: a {m.role} message needs 'content'"
                             + (" (or 'tool_calls')" if m.role == "assistant" else ""))
        if m.role in _ANSWERS and prev not in ("assistant", *_ANSWERS):
            where = "the first message" if prev is None else f"after a {prev} message"
            raise ValueError(f"messages.{i}: a {m.role} message answers an assistant's call "
                             f"and cannot be {where}")
        prev = m.role
