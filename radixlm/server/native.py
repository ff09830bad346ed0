"""POST /generate: the SGLang-style native API.

Request: `{"text" | "input_ids", "sampling_params": {SamplingParams fields}, "stream",
"return_logprob", "top_logprobs_num", "logprob_start_len", "return_text_in_logprobs"}`; a
list of prompts gives a list of results.
Response: `{"text", "output_ids", "meta_info": {"id", "prompt_tokens", "completion_tokens",
"cached_tokens", "finish_reason": {"type": "stop"|"length"|"abort", ...}}}`, with
return_logprob also `{input,output}_token_logprobs` and `{input,output}_top_logprobs` (the
prompt's from logprob_start_len on, SGLang's shapes). As in SGLang, each streamed event
carries the text and ids generated so far (cumulative, not deltas).
"""

from __future__ import annotations

from contextlib import aclosing
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse
from starlette.requests import Request
from starlette.responses import Response

from radixlm.messages import ReqStrOut
from radixlm.server.stream_prime import prime_streams
from radixlm.server.choices import Choice, plan_choices, start_streams
from radixlm.server.http_util import SSEResponse, guarded_sse, run_until_disconnect, sse_event
from radixlm.server.outputs import ChoiceResult, collect_all
from radixlm.server.prompt_logprobs import sglang_input_logprobs
from radixlm.server.protocol import GenerateRequest
from radixlm.server.tokenizer_manager import TokenizerManager


# SGLang's default when sampling_params has no max_new_tokens.
DEFAULT_MAX_NEW_TOKENS = 128


async def generate_native(tm: TokenizerManager, req: GenerateRequest, request: Request) -> Response:
    planned = []
    for prompt in req.prompts():
        ids = tm.tokenize_prompt(prompt)
        default = min(DEFAULT_MAX_NEW_TOKENS, tm.default_max_tokens(len(ids)))
        params = req.to_sampling_params(default)
        tm.check_request(ids, params)
        if req.return_logprob and req.input_logprob_start() >= len(ids):
            raise ValueError(f"logprob_start_len ({req.input_logprob_start()}) must be less "
                             f"than the number of input tokens ({len(ids)})")
        planned.append((ids, params))
    choices = plan_choices(planned, 1, req.timeout)
    if req.stream:
        stream = start_streams(tm, choices, True)
        if choices[0].params.constraint is not None:  # a failing grammar: a 400
            stream = await run_until_disconnect(request, prime_streams(stream))
        return SSEResponse(guarded_sse(_stream(tm, req, choices[0], stream[0]), "generate"))
    results = await run_until_disconnect(request, collect_all(start_streams(tm, choices, False)))
    bodies = [_body(tm, req, c, r) for c, r in zip(choices, results)]
    return JSONResponse(bodies if req.is_batch else bodies[0])


def _finish_reason(r: ChoiceResult) -> dict[str, Any] | None:
    if r.finish_reason is None:
        return None
    if r.finish_reason == "length":
        return {"type": "length", "length": r.completion_tokens}
    if r.finish_reason == "stop":
        return {"type": "stop", "matched": r.matched_stop}
    return {"type": r.finish_reason, "matched": r.matched_stop}


def _body(tm: TokenizerManager, req: GenerateRequest, c: Choice, r: ChoiceResult) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": r.rid,
        "prompt_tokens": max(len(c.input_ids), r.prompt_tokens),
        "completion_tokens": r.completion_tokens,
        "cached_tokens": r.cached_tokens,
        "finish_reason": _finish_reason(r),
    }
    if req.return_logprob:
        def text(t: int) -> str | None:
            return None if req.return_text_in_logprobs is False else tm.token_str(t)

        meta["input_token_logprobs"], meta["input_top_logprobs"] = sglang_input_logprobs(
            r.prompt_logprobs, c.input_ids, req.input_logprob_start(), text,
            req.top_logprobs_num or 0)
        meta["output_token_logprobs"] = [[lp.logprob, lp.token_id, text(lp.token_id)]
                                         for lp in r.logprobs]
        meta["output_top_logprobs"] = [[[v, t, text(t)] for t, v in lp.top]
                                       for lp in r.logprobs]
    return {"text": r.text, "output_ids": list(r.token_ids), "meta_info": meta}


async def _stream(tm: TokenizerManager, req: GenerateRequest, choice: Choice,
                  stream: AsyncGenerator[ReqStrOut, None]) -> AsyncIterator[str]:
    result = ChoiceResult()
    async with aclosing(stream) as outs:
        async for out in outs:
            result.add(out)
            yield sse_event(_body(tm, req, choice, result))
