"""Priming streams: wait for each stream's first output before the response starts.

A constrained request can still fail after it was sent (its grammar fails to compile or
passes --grammar-compile-timeout): awaiting the first output of every choice before the
SSE status line goes out turns that failure into a real HTTP 400 instead of an error
event inside a 200 stream. Unconstrained requests are not primed (no added latency).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import suppress
from typing import TypeVar

T = TypeVar("T")


async def _prepend(first: T, rest: AsyncGenerator[T, None]) -> AsyncGenerator[T, None]:
    try:
        yield first
        async for item in rest:
            yield item
    finally:
        await rest.aclose()


async def prime_streams(streams: list[AsyncGenerator[T, None]]) -> list[AsyncGenerator[T, None]]:
    """The same streams, each with its first item already received. If any stream fails
    (or ends) before its first item, every stream is closed (aborting its request) and
    the error is raised."""
    tasks = [asyncio.ensure_future(s.__anext__()) for s in streams]
    try:
        firsts = await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        for s in streams:
            with suppress(Exception):
                await s.aclose()
        raise
    return [_prepend(f, s) for f, s in zip(firsts, streams)]
