"""Broadcast: one poller feeding every open server-sent-event stream of a dashboard.

Invariants:
- Nothing runs while nobody watches: the poll task starts with the first subscriber and
  stops with the last.
- One `update()` per interval whatever the number of pages: it is encoded once and the
  same bytes go to every subscriber; a slow page drops updates (its queue holds at most
  QUEUE_LEN), it never slows the others.
- Streams end when `ended()` says so (the server exits or has drained), so they never hold
  up uvicorn's shutdown.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

logger = logging.getLogger(__name__)

QUEUE_LEN = 4


def sse(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class Broadcast:
    interval_s: float = 0.25

    def __init__(self) -> None:
        self.subscribers: set[asyncio.Queue[bytes | None]] = set()
        self._task: asyncio.Task[None] | None = None

    # --- to override ------------------------------------------------------------------

    async def update(self) -> dict[str, Any]:
        raise NotImplementedError

    def first_update(self) -> dict[str, Any] | None:
        """What a new subscriber gets at once (the latest state with its history)."""
        return None

    def ended(self) -> bool:
        return False

    # --- streams ------------------------------------------------------------------------

    async def stream(self) -> AsyncIterator[bytes]:
        """The bytes of one event-stream response."""
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=QUEUE_LEN)
        self.subscribers.add(queue)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._poll())
        try:
            yield b"retry: 2000\n\n"
            if (first := self.first_update()) is not None:
                yield sse("update", first)
            while True:
                chunk = await queue.get()
                if chunk is None:
                    return
                yield chunk
        finally:
            self.subscribers.discard(queue)

    def _publish(self, chunk: bytes | None) -> None:
        for q in self.subscribers:
            if q.full():
                q.get_nowait()  # a slow page drops its oldest update
            q.put_nowait(chunk)

    async def _poll(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self.subscribers:
                t0 = loop.time()
                self._publish(sse("update", await self.update()))
                if self.ended():
                    self._publish(None)
                    return
                await asyncio.sleep(max(0.0, self.interval_s - (loop.time() - t0)))
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug here must not take the server down; pages reconnect
            logger.exception("dashboard poller failed")
            self._publish(None)
