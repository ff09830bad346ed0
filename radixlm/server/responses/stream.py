"""Streaming a response: the chat path's SSE chunks turned into the Responses API's typed
events.

Order (OpenAI's): response.created, response.in_progress, then per output item
output_item.added, [content_part.added, output_text.delta..., output_text.done,
content_part.done | function_call_arguments.delta..., function_call_arguments.done],
output_item.done, and last response.completed (or response.incomplete / response.failed).
Every event carries a `sequence_number` counting from 0; one item is open at a time (the
text is closed before the first call opens).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from radixlm.server.responses.objects import (call_item, message_item, new_id, status_of,
                                              text_part, usage_of)
from radixlm.server.responses.request import responses_field_names


@dataclass
class _Open:
    """The output item being streamed."""

    index: int
    item: dict[str, Any]
    text: str = ""


@dataclass
class ResponseEvents:
    """Builds the event stream; `finish(body)` receives the final response body."""

    base: dict[str, Any]  # response_body(...) with status in_progress and no output yet
    make_body: Callable[[list[dict[str, Any]], str, dict[str, Any] | None], dict[str, Any]]
    seq: int = 0
    output: list[dict[str, Any]] = field(default_factory=list)
    open: _Open | None = None
    calls: dict[int, _Open] = field(default_factory=dict)  # chat tool-call index -> item

    def event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(data)}\n\n"

    def _close_open(self) -> list[str]:
        o, self.open = self.open, None
        if o is None:
            return []
        item_id = o.item["id"]
        if o.item["type"] == "message":
            part = text_part(o.text)
            done = message_item(item_id, o.text)
            out = [self.event("response.output_text.done", item_id=item_id,
                              output_index=o.index, content_index=0, text=o.text,
                              logprobs=[]),
                   self.event("response.content_part.done", item_id=item_id,
                              output_index=o.index, content_index=0, part=part)]
        else:
            done = call_item(item_id, o.item["call_id"], o.item["name"], o.text)
            out = [self.event("response.function_call_arguments.done", item_id=item_id,
                              output_index=o.index, name=o.item["name"], arguments=o.text)]
        self.output.append(done)
        out.append(self.event("response.output_item.done", output_index=o.index, item=done))
        return out

    def on_chunk(self, chunk: dict[str, Any]) -> list[str]:
        out: list[str] = []
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if self.open is None or self.open.item["type"] != "message":
                    out += self._close_open()
                    item = message_item(new_id("msg"), "", "in_progress")
                    self.open = _Open(len(self.output), item)
                    out.append(self.event("response.output_item.added",
                                          output_index=self.open.index, item=item))
                    out.append(self.event("response.content_part.added", item_id=item["id"],
                                          output_index=self.open.index, content_index=0,
                                          part=text_part("")))
                self.open.text += delta["content"]
                out.append(self.event("response.output_text.delta",
                                      item_id=self.open.item["id"],
                                      output_index=self.open.index, content_index=0,
                                      delta=delta["content"], logprobs=[]))
            for call in delta.get("tool_calls") or []:
                fn = call.get("function") or {}
                if call.get("id") is not None:  # a new call opens
                    out += self._close_open()
                    item = call_item(new_id("fc"), call["id"], fn.get("name", ""), "",
                                     "in_progress")
                    self.open = _Open(len(self.output), item)
                    out.append(self.event("response.output_item.added",
                                          output_index=self.open.index, item=item))
                if fn.get("arguments") and self.open is not None:
                    self.open.text += fn["arguments"]
                    out.append(self.event("response.function_call_arguments.delta",
                                          item_id=self.open.item["id"],
                                          output_index=self.open.index,
                                          delta=fn["arguments"]))
            if choice.get("finish_reason") is not None:
                self.base["status"] = status_of(choice["finish_reason"])
        if chunk.get("usage") is not None:
            self.base["usage"] = chunk["usage"]
        return out

    def finish(self) -> tuple[list[str], dict[str, Any]]:
        out = self._close_open()
        status = self.base.get("status", "completed")
        if status == "in_progress":
            status = "completed"
        body = self.make_body(self.output, status, usage_of(self.base.get("usage")))
        kind = "response.completed" if status == "completed" else "response.incomplete"
        out.append(self.event(kind, response=body))
        return out, body


async def response_events(chat_sse: AsyncIterator[str], events: ResponseEvents,
                          start_body: dict[str, Any],
                          on_done: Callable[[dict[str, Any]], None]) -> AsyncIterator[str]:
    """Relay `chat_sse` (the chat path's `data: ...` events) as Responses events; a
    finished response is handed to `on_done` (the store)."""
    yield events.event("response.created", response=start_body)
    yield events.event("response.in_progress", response=start_body)
    async with aclosing(chat_sse) as chunks:
        async for raw in chunks:
            for line in raw.splitlines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    err = {**chunk["error"],
                           "message": responses_field_names(chunk["error"].get("message")),
                           "param": responses_field_names(chunk["error"].get("param"))}
                    yield events.event("error", code=str(err.get("code")),
                                       message=err.get("message"), param=err.get("param"))
                    # The server's own failures are "server_error"; a request's own
                    # limit (its `timeout`: 408) keeps its type, e.g. "timeout_error".
                    status = err.get("code")
                    code = (err.get("type") or "server_error"
                            if isinstance(status, int) and status < 500 else "server_error")
                    failed = {**start_body, "status": "failed",
                              "error": {"code": code, "message": err.get("message")}}
                    yield events.event("response.failed", response=failed)
                    return
                for e in events.on_chunk(chunk):
                    yield e
    tail, body = events.finish()
    on_done(body)
    for e in tail:
        yield e
