"""POST /v1/chat/completions: OpenAI chat completions, streamed (SSE) or not."""

from __future__ import annotations

import time
import uuid
from contextlib import aclosing
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse
from starlette.requests import Request
from starlette.responses import Response

from radixlm.server.choices import Choice, plan_choices, start_streams, usage_of
from radixlm.server.http_util import SSEResponse, guarded_sse, run_until_disconnect, sse_event
from radixlm.server.logprobs import chat_logprobs
from radixlm.server.outputs import ChoiceResult, collect_all, merge_streams
from radixlm.server.protocol import ChatCompletionRequest
from radixlm.server.tokenizer_manager import TokenizerManager



async def create_chat_completion(tm: TokenizerManager, req: ChatCompletionRequest,
                                 model_name: str, request: Request) -> Response:
    """Validate everything (ValueError -> 400) before the first byte is sent."""
    ids = tm.apply_chat_template(req.template_messages(), tools=req.tools,
                                 add_generation_prompt=req.add_generation_prompt is not False)
    params = req.sampling_params(tm.default_max_tokens(len(ids)))
    tm.check_request(ids, params)
    choices = plan_choices([(ids, params)], req.num_choices, req.timeout)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()),
            "model": model_name}
    if req.stream:
        return SSEResponse(guarded_sse(
            _stream(tm, req, choices, {**head, "object": "chat.completion.chunk"}), "chat"))

    results = await run_until_disconnect(request, collect_all(start_streams(tm, choices, False)))
    body_choices = []
    for c, r in zip(choices, results):
        body_choices.append({
            "index": c.index,
            "message": {"role": "assistant", "content": r.text},
            "logprobs": _logprobs(tm, req, r.logprobs),
            "finish_reason": r.finish_reason,
            "stop_reason": r.matched_stop,
        })
    return JSONResponse({**head, "object": "chat.completion", "choices": body_choices,
                         "usage": usage_of(choices, results)})


def _logprobs(tm: TokenizerManager, req: ChatCompletionRequest, lps: list[Any] | None) -> Any:
    if not req.logprobs:
        return None
    return chat_logprobs(lps or [], tm.token_str, req.top_logprobs or 0)


async def _stream(tm: TokenizerManager, req: ChatCompletionRequest, choices: list[Choice],
                  head: dict[str, Any]) -> AsyncIterator[str]:
    def chunk(index: int, delta: dict[str, Any], logprobs: Any = None,
              finish_reason: str | None = None, stop_reason: Any = None) -> str:
        choice = {"index": index, "delta": delta, "logprobs": logprobs,
                  "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["stop_reason"] = stop_reason
        return sse_event({**head, "choices": [choice]})

    # OpenAI's first chunk of every choice carries only the role.
    for c in choices:
        yield chunk(c.index, {"role": "assistant", "content": ""})
    results = [ChoiceResult() for _ in choices]
    async with aclosing(merge_streams(start_streams(tm, choices, True))) as merged:
        async for k, out in merged:
            results[k].add(out)
            if not out.text_delta and out.finish_reason is None and not out.logprobs:
                continue
            delta = {"content": out.text_delta} if out.text_delta else {}
            yield chunk(choices[k].index, delta, _logprobs(tm, req, out.logprobs),
                        out.finish_reason, out.matched_stop)
    if req.include_usage:
        yield sse_event({**head, "choices": [], "usage": usage_of(choices, results)})
