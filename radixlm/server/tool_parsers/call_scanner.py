"""CallScanner: an incremental scanner of tool-call JSON objects in generated text.

It is fed the text of a tool-call region piece by piece and reports, per call, its
name as soon as the name string is complete and its arguments as raw JSON text
fragments as they arrive. Every format we parse is a sequence of objects
`{"name": ..., "arguments" | "parameters": <JSON>}` with wrappers between them
(`<tool_call>` tags, `[`, `,`, `;`, `<|python_tag|>`): at depth 0 everything but `{` is
skipped, so one scanner serves every parser.

Invariant: the concatenated argument fragments of a call are exactly the raw text of
its arguments value (or "{}" when it has none), and the non-streaming parse runs the
same scanner over the whole text, so streamed deltas reassemble to the non-streamed
answer by construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ARG_KEYS = ("arguments", "parameters")


@dataclass(slots=True)
class CallEvent:
    """index: the call's position; name set on its first event; arguments: a fragment."""

    index: int
    name: str | None = None
    arguments: str = ""
    done: bool = False


@dataclass(slots=True)
class _Call:
    name: str | None = None
    args: list[str] = field(default_factory=list)  # fragments not yet reported (no name)
    got_args: bool = False
    announced: bool = False


class CallScanner:
    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.calls: list[_Call] = []
        # Depth-1 parse state of the current object: "key", "colon", "value", "after".
        self.state = "key"
        self.key_chars: list[str] | None = None  # collecting a key string at depth 1
        self.key = ""
        self.value_kind = ""  # "", "container", "string", "scalar"; "" = not started
        self.value_depth = 0
        self.name_chars: list[str] | None = None
        self.events: list[CallEvent] = []

    @property
    def num_calls(self) -> int:
        return len(self.calls)

    @property
    def inside_call(self) -> bool:
        return self.depth > 0

    def feed(self, text: str) -> list[CallEvent]:
        """Scan `text`; return the events it completes (merged per call)."""
        self.events = []
        for ch in text:
            self._char(ch)
        return _merge(self.events)

    # --- internals ---------------------------------------------------------------------

    def _cur(self) -> _Call:
        return self.calls[-1]

    def _arg(self, s: str) -> None:
        call = self._cur()
        call.got_args = True
        if call.name is None:
            call.args.append(s)  # reported once the name is known
        else:
            self.events.append(CallEvent(len(self.calls) - 1, arguments=s))

    def _announce(self) -> None:
        call, i = self._cur(), len(self.calls) - 1
        call.announced = True
        self.events.append(CallEvent(i, name=call.name, arguments="".join(call.args)))
        call.args = []

    def _end_value(self) -> None:
        self.state = "after"
        self.value_kind = ""

    def _char(self, ch: str) -> None:
        if self.depth == 0:
            if ch == "{":  # a new call object
                self.depth = 1
                self.calls.append(_Call())
                self.state, self.key, self.value_kind = "key", "", ""
            return
        in_args = self.state == "value" and self.key in ARG_KEYS
        if self.in_string:
            if in_args:
                self._arg(ch)
            if self.escape:
                self.escape = False
                if self.key_chars is not None:
                    self.key_chars.append(ch)
                elif self.name_chars is not None:
                    self.name_chars.append(ch)
                return
            if ch == "\\":
                self.escape = True
                if self.key_chars is not None:
                    self.key_chars.append(ch)
                elif self.name_chars is not None:
                    self.name_chars.append(ch)
                return
            if ch == '"':
                self.in_string = False
                if self.key_chars is not None:
                    self.key = "".join(self.key_chars)
                    self.key_chars = None
                    self.state = "colon"
                elif self.name_chars is not None:
                    self._cur().name = _unescape("".join(self.name_chars))
                    self.name_chars = None
                    self._announce()
                    self._end_value()
                elif self.value_kind == "string" and self.depth == self.value_depth:
                    self._end_value()
                return
            if self.key_chars is not None:
                self.key_chars.append(ch)
            elif self.name_chars is not None:
                self.name_chars.append(ch)
            return
        # Outside strings.
        if self.state == "value" and self.value_kind == "":
            if ch.isspace():
                return
            self.value_depth = self.depth
            if ch in "{[":
                self.value_kind = "container"
            elif ch == '"':
                self.value_kind = "string"
                if self.key == "name":
                    self.in_string = True
                    self.name_chars = []
                    return
            else:
                self.value_kind = "scalar"
        if self.state == "value" and self.value_kind == "scalar" and (
                ch.isspace() or ch in ",}]"):
            self._end_value()
            in_args = False
        if in_args and self.state == "value":
            self._arg(ch)
        if ch == '"':
            self.in_string = True
            if self.depth == 1 and self.state == "key":
                self.key_chars = []
            return
        if ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1
            if self.state == "value" and self.value_kind == "container" \
                    and self.depth == self.value_depth:
                self._end_value()
            if self.depth == 0:
                self._close_call()
        elif ch == ":" and self.depth == 1 and self.state == "colon":
            self.state = "value"
            self.value_kind = ""
        elif ch == "," and self.depth == 1:
            self.state = "key"

    def _close_call(self) -> None:
        call, i = self._cur(), len(self.calls) - 1
        if call.name is None:
            call.name = ""
            self._announce()
        if not call.got_args:
            self.events.append(CallEvent(i, arguments="{}"))
        self.events.append(CallEvent(i, done=True))


def _unescape(s: str) -> str:
    import json

    try:
        return json.loads(f'"{s}"')
    except ValueError:
        return s


def _merge(events: list[CallEvent]) -> list[CallEvent]:
    """Adjacent events of the same call become one (name kept, fragments joined)."""
    out: list[CallEvent] = []
    for e in events:
        if out and out[-1].index == e.index and not out[-1].done and e.name is None:
            last = out[-1]
            last.arguments += e.arguments
            last.done = e.done
        else:
            out.append(CallEvent(e.index, e.name, e.arguments, e.done))
    return out
