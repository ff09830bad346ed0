"""Aggregating a request's `ReqStrOut` stream, and merging several streams into one.

One `generate()` stream = one choice. A non-streaming response collects each stream into a
`ChoiceResult`; a streaming response merges the choices' streams and tags each item with
its choice index.
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from radixlm.messages import PromptLogprobs, ReqStrOut, TokenLogprob

T = TypeVar("T")


@dataclass(slots=True)
class ChoiceResult:
    """Everything a request produced, accumulated over its ReqStrOuts."""

    rid: str = ""
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    matched_stop: str | int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: PromptLogprobs | None = None

    def add(self, out: ReqStrOut) -> None:
        self.rid = out.rid
        self.text += out.text_delta
        self.token_ids.extend(out.token_ids_delta)
        if out.logprobs:
            self.logprobs.extend(out.logprobs)
        if out.prompt_logprobs is not None:
            self.prompt_logprobs = out.prompt_logprobs
        # Counts are totals so far (or only set on the last message): keep the largest.
        self.prompt_tokens = max(self.prompt_tokens, out.prompt_tokens)
        self.completion_tokens = max(self.completion_tokens, out.completion_tokens,
                                     len(self.token_ids))
        self.cached_tokens = max(self.cached_tokens, out.cached_tokens)
        if out.finish_reason is not None:
            self.finish_reason = out.finish_reason
            self.matched_stop = out.matched_stop


async def collect(stream: AsyncGenerator[ReqStrOut, None]) -> ChoiceResult:
    result = ChoiceResult()
    async with aclosing(stream):
        async for out in stream:
            result.add(out)
    return result


async def collect_all(streams: Sequence[AsyncGenerator[ReqStrOut, None]]) -> list[ChoiceResult]:
    """Collect several streams concurrently. If one fails (or we are cancelled), the
    others are cancelled too, which aborts their requests."""
    tasks = [asyncio.ensure_future(collect(s)) for s in streams]
    try:
        # gather re-raises the first error as is (a TaskGroup would wrap it in a group).
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:  # no-op for finished tasks; aborts the rest after an error
            t.cancel()


_DONE = object()


async def merge_streams(streams: Sequence[AsyncGenerator[T, None]]) -> AsyncIterator[tuple[int, T]]:
    """Yield `(stream index, item)` in arrival order until every stream is exhausted.

    An exception from any stream is re-raised here. When the consumer stops early, the
    pump tasks are cancelled, so each stream's own cleanup (AbortReq) runs.
    """
    if len(streams) == 1:  # common case: no tasks needed
        async with aclosing(streams[0]) as only:
            async for item in only:
                yield 0, item
        return
    queue: asyncio.Queue[tuple[int, object, BaseException | None]] = asyncio.Queue()

    async def pump(i: int, stream: AsyncGenerator[T, None]) -> None:
        try:
            async with aclosing(stream):
                async for item in stream:
                    queue.put_nowait((i, item, None))
            queue.put_nowait((i, _DONE, None))
        except Exception as e:
            queue.put_nowait((i, _DONE, e))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item, exc = await queue.get()
            if exc is not None:
                raise exc
            if item is _DONE:
                remaining -= 1
            else:
                yield i, item  # type: ignore[misc]
    finally:
        # No await here: we may be inside a cancellation. The cancelled pumps run the
        # streams' finally blocks on their next step.
        for t in tasks:
            t.cancel()


@dataclass(slots=True)
class UsageCounter:
    """OpenAI usage over all choices: each prompt counts once, every choice's completion
    counts. Cached tokens are the best hit among a prompt's choices."""

    prompt_tokens: dict[int, int] = field(default_factory=dict)  # prompt index -> count
    cached_tokens: dict[int, int] = field(default_factory=dict)
    completion_tokens: dict[int, int] = field(default_factory=dict)  # choice index -> count

    def add(self, prompt_idx: int, choice_idx: int, prompt_tokens: int, cached_tokens: int,
            completion_tokens: int) -> None:
        self.prompt_tokens[prompt_idx] = max(self.prompt_tokens.get(prompt_idx, 0), prompt_tokens)
        self.cached_tokens[prompt_idx] = max(self.cached_tokens.get(prompt_idx, 0), cached_tokens)
        self.completion_tokens[choice_idx] = max(self.completion_tokens.get(choice_idx, 0),
                                                 completion_tokens)

    def to_dict(self) -> dict[str, object]:
        prompt = sum(self.prompt_tokens.values())
        completion = sum(self.completion_tokens.values())
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": sum(self.cached_tokens.values())}}
