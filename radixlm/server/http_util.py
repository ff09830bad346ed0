"""HTTP plumbing: Server-Sent Events and cancelling work when the client goes away.

Both paths guarantee that a client disconnect cancels the coroutine producing the output,
so `TokenizerManager.generate`'s cleanup sends `AbortReq` for every request in flight.
"""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import aclosing
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from radixlm.server.errors import APIError, error_body, stream_error_status

T = TypeVar("T")

logger = logging.getLogger(__name__)

SSE_DONE = "data: [DONE]\n\n"


async def guarded_sse(events: AsyncIterator[str], what: str) -> AsyncIterator[str]:
    """Relay SSE events; an exception raised after the status line went out is reported
    in-band as an OpenAI error event. The stream always ends with [DONE]. Closing this
    generator (client gone) closes `events`, which aborts its requests."""
    try:
        async with aclosing(events):
            async for event in events:
                yield event
    except Exception as e:
        status = stream_error_status(e)
        if status == 500:
            logger.exception("%s stream failed", what)
        yield sse_event(error_body(status, str(e)))
    yield SSE_DONE


# One encoder for every event: json.dumps with non-default options builds a new
# JSONEncoder per call (an SSE event per streamed chunk).
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False)


def sse_event(obj: Any) -> str:
    return f"data: {_ENCODER.encode(obj)}\n\n"


class SSEResponse(StreamingResponse):
    """A `text/event-stream` response that always watches for the client disconnecting.

    Starlette only watches for `http.disconnect` under ASGI spec < 2.4; here we always do,
    and we close the body iterator in every case so its `finally` blocks run promptly.
    `on_close` callbacks run once the stream has ended, however it ended (admission
    releases the request's slots there).
    """

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str]) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._events = content
        self.on_close: list[Callable[[], None]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:

                async def stream_then_stop() -> None:
                    try:
                        await self.stream_response(send)
                    except Exception:  # the status line is out: all we can do is hang up
                        logger.exception("SSE stream failed")
                    tg.cancel_scope.cancel()

                async def disconnect_then_stop() -> None:
                    await self.listen_for_disconnect(receive)
                    tg.cancel_scope.cancel()

                tg.start_soon(stream_then_stop)
                tg.start_soon(disconnect_then_stop)
        finally:
            try:
                aclose = getattr(self._events, "aclose", None)
                if aclose is not None:
                    with anyio.CancelScope(shield=True):
                        await aclose()
            finally:
                for callback in self.on_close:
                    callback()


class ClientDisconnected(Exception):
    pass


async def run_until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`; if the client disconnects first, cancel it and raise
    ClientDisconnected. Call after the request body has been read."""
    work_task = asyncio.ensure_future(work)

    async def wait_disconnect() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch_task = asyncio.ensure_future(wait_disconnect())
    try:
        await asyncio.wait({work_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # Also reached when we are cancelled ourselves: cancel both either way.
        watch_task.cancel()
        if not work_task.done():
            work_task.cancel()
    if work_task.done() and not work_task.cancelled():
        return work_task.result()
    raise ClientDisconnected()


def check_json_body(request: Request) -> None:
    """415 unless the body is declared JSON (`application/json` or `+json`); a request
    without a Content-Type is read as JSON, as OpenAI clients always send it."""
    kind = request.headers.get("content-type")
    if kind is None:
        return
    media = kind.split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise APIError(415, f"Unsupported Content-Type {media!r}: the body must be JSON "
                       "(application/json).")
