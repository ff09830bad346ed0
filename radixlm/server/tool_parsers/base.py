"""Tool parsers: where the tool calls are in a model's text, by format.

A parser declares its start markers; `ToolCallStream` does the rest for every format:
text before the first marker is content (a suffix that may be the start of a marker is
held back, so a partial start tag never leaks as content), everything after it is the
tool-call region, scanned by `CallScanner`. `parse()` (non-streaming) runs the same
stream over the whole text, so streamed deltas reassemble to the non-streamed answer.
"""

from __future__ import annotations

import uuid
from abc import ABC
from dataclasses import dataclass
from typing import ClassVar

from radixlm.server.tool_parsers.call_scanner import CallEvent, CallScanner


@dataclass(slots=True)
class ToolCall:
    name: str
    arguments: str  # raw JSON text of the arguments, as generated

    def to_openai(self, call_id: str | None = None) -> dict[str, object]:
        return {"id": call_id or new_call_id(), "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolParser(ABC):
    """One tool-call format. Subclasses set the class attributes only."""

    name: ClassVar[str]
    start_markers: ClassVar[tuple[str, ...]]
    # The region may only start at the beginning of the text (after whitespace); then a
    # marker may be "{" itself (llama3_json: the whole answer is the call).
    at_start_only: ClassVar[bool] = False
    # A chat template (radixlm/server/tool_parsers/templates/) for models whose own
    # template does not render tools; None: the model's template does.
    fallback_template: ClassVar[str | None] = None

    def stream(self) -> "ToolCallStream":
        return ToolCallStream(self)

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """(content, calls), exactly what streaming `text` reports: a call counts once its
        name is complete (arguments cut off by max_tokens stay cut off, as in the
        stream); a region in which no name completes is content."""
        return parse_with(self.stream(), text)


def parse_with(stream: "ToolCallStream", text: str) -> tuple[str, list[ToolCall]]:
    content, events = stream.feed(text)
    more, tail = stream.finish()
    content += more
    if stream.in_region and not stream.announced:
        return text, []
    return content, assemble(events + tail)


def assemble(events: list[CallEvent]) -> list[ToolCall]:
    calls: dict[int, ToolCall] = {}
    for e in events:
        call = calls.setdefault(e.index, ToolCall("", ""))
        if e.name is not None:
            call.name = e.name
        call.arguments += e.arguments
    return [calls[i] for i in sorted(calls)]


class ToolCallStream:
    """Incremental split of generated text into content and tool-call events."""

    def __init__(self, parser: ToolParser | None, region_from_start: bool = False) -> None:
        self.markers = parser.start_markers if parser is not None else ()
        self.at_start_only = parser.at_start_only if parser is not None else False
        self.scanner = CallScanner()
        self.in_region = region_from_start
        self.plain = False  # decided: no tool call in this text (at_start_only formats)
        self.buf = ""
        self.sent = 0  # buf[:sent] was emitted as content or consumed by the region
        self.region_start = 0  # where the tool region (its marker) starts in buf
        self.announced = False  # a call's name was reported

    def _events(self, text: str) -> list[CallEvent]:
        events = self.scanner.feed(text)
        self.announced |= any(e.name is not None for e in events)
        return events

    def feed(self, delta: str) -> tuple[str, list[CallEvent]]:
        """(content to emit now, call events)."""
        self.buf += delta
        if self.in_region:
            return "", self._events(delta)
        if self.plain:
            return self._emit(len(self.buf)), []
        if self.at_start_only:
            return self._feed_at_start()
        pending = self.buf[self.sent:]
        hits = [(pending.find(m), m) for m in self.markers if m in pending]
        if hits:
            idx, marker = min(hits)
            content = self._emit(self.sent + idx)
            self.in_region = True
            self.region_start = self.sent
            rest = pending[idx + len(marker):]
            self.sent = len(self.buf)
            return content, self._events(rest)
        return self._emit(len(self.buf) - _held(pending, self.markers)), []

    def _feed_at_start(self) -> tuple[str, list[CallEvent]]:
        head = self.buf.lstrip()
        if not head:
            return "", []
        for m in self.markers:
            if head.startswith(m):
                self.in_region = True
                self.sent = len(self.buf)
                # "{" is part of the call; a tag marker is not.
                return "", self._events(head if m == "{" else head[len(m):])
        if any(m.startswith(head) for m in self.markers):
            return "", []  # still undecided (a partial tag)
        self.plain = True
        return self._emit(len(self.buf)), []

    def finish(self) -> tuple[str, list[CallEvent]]:
        """At the end of the text: flush held-back content. A region in which no call
        was ever announced (e.g. cut off before the name) turns out to be content."""
        if self.in_region:
            if self.announced:
                return "", []
            return self.buf[self.region_start:], []
        return self._emit(len(self.buf)), []

    def _emit(self, upto: int) -> str:
        out = self.buf[self.sent:upto]
        self.sent = max(self.sent, upto)
        return out


def _held(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a marker."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best
