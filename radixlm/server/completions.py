"""POST /v1/completions: OpenAI text completions, streamed (SSE) or not."""

from __future__ import annotations

import time
import uuid
from contextlib import aclosing
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse
from starlette.requests import Request
from starlette.responses import Response

from radixlm.messages import ReqStrOut
from radixlm.server.stream_prime import prime_streams
from radixlm.server.choices import Choice, plan_choices, start_streams, usage_of
from radixlm.server.http_util import SSEResponse, guarded_sse, run_until_disconnect, sse_event
from radixlm.server.logprobs import completion_logprobs
from radixlm.server.openai_extras import completion_max_tokens, token_id_fields, truncate_prompt
from radixlm.server.outputs import ChoiceResult, collect_all, merge_streams
from radixlm.server.prompt_logprobs import echo_logprobs, join_logprobs, vllm_prompt_logprobs
from radixlm.server.protocol import CompletionRequest
from radixlm.server.tokenizer_manager import TokenizerManager



async def create_completion(tm: TokenizerManager, req: CompletionRequest, model_name: str,
                            request: Request) -> Response:
    """Validate everything (ValueError -> 400) before the first byte is sent."""
    planned = []
    echoes: list[str] = []  # each prompt's text, for `echo`
    for prompt in req.prompts():
        ids = truncate_prompt(tm.tokenize_prompt(prompt), req.truncate_prompt_tokens,
                              tm.context_len)
        params = req.sampling_params(completion_max_tokens(tm.default_max_tokens(len(ids))))
        tm.check_request(ids, params)
        planned.append((ids, params))
        if req.echo:
            untouched = isinstance(prompt, str) and req.truncate_prompt_tokens is None
            echoes.append(prompt if untouched else tm.tokenizer.decode(ids))
    choices = plan_choices(planned, req.num_choices, req.timeout)
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
            "created": int(time.time()), "model": model_name}
    if req.stream:
        streams = start_streams(tm, choices, True)
        if any(c.params.constraint is not None for c in choices):
            # A grammar that fails to compile is a 400, not an error event in a 200.
            streams = await run_until_disconnect(request, prime_streams(streams))
        return SSEResponse(guarded_sse(_stream(req, choices, streams, head, tm, echoes),
                                       "completion"))

    results = await run_until_disconnect(request, collect_all(start_streams(tm, choices, False)))
    body_choices = []
    for c, r in zip(choices, results):
        text = echoes[c.prompt_idx] + r.text if req.echo else r.text
        body_choices.append({"index": c.index, "text": text,
                             "logprobs": _logprobs(req, tm, c, r, r.logprobs,
                                                   echoes[c.prompt_idx] if req.echo else None)[0],
                             "finish_reason": r.finish_reason, "stop_reason": r.matched_stop,
                             **_prompt_logprobs_field(req, tm, r),
                             **token_id_fields(req.return_token_ids, c.input_ids,
                                               r.token_ids)})
    return JSONResponse({**head, "choices": body_choices, "usage": usage_of(choices, results)})


async def _stream(req: CompletionRequest, choices: list[Choice],
                  streams: list[AsyncGenerator[ReqStrOut, None]], head: dict[str, Any],
                  tm: TokenizerManager, echoes: list[str]) -> AsyncIterator[str]:
    results = [ChoiceResult() for _ in choices]
    offsets = [0] * len(choices)  # text_offset of each choice's next token
    first = [True] * len(choices)
    # Echo with logprobs waits for the prompt's logprobs (the choice's first output).
    for k, c in enumerate(choices) if req.echo and req.logprobs is None else ():
        first[k] = False
        yield sse_event({**head, "choices": [{
            "index": c.index, "text": echoes[c.prompt_idx], "logprobs": None,
            "finish_reason": None, **token_id_fields(req.return_token_ids, c.input_ids, [])}]})
    async with aclosing(merge_streams(streams)) as merged:
        async for k, out in merged:
            results[k].add(out)
            if (not out.text_delta and out.finish_reason is None and not out.logprobs
                    and out.prompt_logprobs is None):
                continue
            c = choices[k]
            echo = echoes[c.prompt_idx] if req.echo and req.logprobs is not None and first[k] \
                else None
            logprobs, offsets[k] = _logprobs(req, tm, c, out, out.logprobs or [], echo, offsets[k])
            choice = {"index": c.index, "text": (echo or "") + out.text_delta,
                      "logprobs": logprobs, "finish_reason": out.finish_reason,
                      "stop_reason": out.matched_stop,
                      **(_prompt_logprobs_field(req, tm, out) if out.prompt_logprobs is not None else {}),
                      **token_id_fields(req.return_token_ids,
                                        choices[k].input_ids if first[k] else None,
                                        out.token_ids_delta)}
            first[k] = False
            event = {**head, "choices": [choice]}
            if req.continuous_usage:
                event["usage"] = usage_of(choices, results)
            yield sse_event(event)
    if req.include_usage:
        yield sse_event({**head, "choices": [], "usage": usage_of(choices, results)})


def _logprobs(req: CompletionRequest, tm: TokenizerManager, c: Choice,
              r: ChoiceResult | ReqStrOut, lps: list, echo: str | None,
              offset: int = 0) -> tuple[dict[str, Any] | None, int]:
    """The choice's `logprobs` object (None when not asked for) and the text offset after
    its tokens; with `echo` (the prompt's text) the prompt's tokens come first."""
    if req.logprobs is None:
        return None, offset
    head = None
    if echo is not None:
        head, _ = echo_logprobs(r.prompt_logprobs, c.input_ids, tm.token_str, req.logprobs)
        offset = len(echo)
    body, end = completion_logprobs(lps, tm.token_str, req.logprobs, offset)
    return (join_logprobs(head, body) if head is not None else body), end


def _prompt_logprobs_field(req: CompletionRequest, tm: TokenizerManager,
                           r: ChoiceResult | ReqStrOut) -> dict[str, Any]:
    if req.prompt_logprobs is None:
        return {}
    return {"prompt_logprobs": vllm_prompt_logprobs(r.prompt_logprobs, tm.token_str,
                                                    req.prompt_logprobs)}
