"""POST /v1/chat/completions: OpenAI chat completions, streamed (SSE) or not.

Tools (`tools.py`): tool_choice auto parses the answer with the --tool-call-parser,
required / named constrain it to a JSON array of calls; either way an answer with calls
has `message.tool_calls` (streamed: `delta.tool_calls`) and finish_reason "tool_calls".
"""

from __future__ import annotations

import time
import uuid
from contextlib import aclosing
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse
from starlette.requests import Request
from starlette.responses import Response

from radixlm.constrained.constraint import ConstraintError
from radixlm.messages import ReqStrOut
from radixlm.server.choices import Choice, plan_choices, start_streams, usage_of
from radixlm.server.http_util import SSEResponse, guarded_sse, run_until_disconnect, sse_event
from radixlm.server.logprobs import chat_logprobs
from radixlm.server.prompt_logprobs import vllm_prompt_logprobs
from radixlm.server.openai_extras import token_id_fields, truncate_prompt
from radixlm.server.outputs import ChoiceResult, collect_all, merge_streams
from radixlm.server.protocol import ChatCompletionRequest
from radixlm.server.stream_prime import prime_streams
from radixlm.server.tokenizer_manager import TokenizerManager
from radixlm.server.tools import ToolDeltas, ToolPlan, plan_tools, tool_message


async def create_chat_completion(tm: TokenizerManager, req: ChatCompletionRequest,
                                 model_name: str, request: Request) -> Response:
    """Validate everything (ValueError -> 400) before the first byte is sent."""
    plan = plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls,
                      getattr(tm.tokenizer, "chat_template", None), tm.args.tool_call_parser)
    ids = tm.apply_chat_template(req.template_messages(), tools=plan.template_tools,
                                 add_generation_prompt=req.add_generation_prompt is not False,
                                 chat_template=plan.chat_template,
                                 continue_final_message=bool(req.continue_final_message))
    ids = truncate_prompt(ids, req.truncate_prompt_tokens, tm.context_len)
    params = req.sampling_params(tm.default_max_tokens(len(ids)))
    if plan.constraint is not None:
        if params.constraint is not None:
            raise ConstraintError(f"tool_choice {req.tool_choice!r} constrains the answer to "
                                  f"tool calls; it cannot be combined with "
                                  f"{params.constraint.field}", "tool_choice")
        params.constraint = plan.constraint
    tm.check_request(ids, params)
    choices = plan_choices([(ids, params)], req.num_choices, req.timeout)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()),
            "model": model_name}
    if req.stream:
        streams = start_streams(tm, choices, True)
        if params.constraint is not None:  # a grammar that fails is a 400, not an event
            streams = await run_until_disconnect(request, prime_streams(streams))
        return SSEResponse(guarded_sse(
            _stream(tm, req, plan, choices, streams,
                    {**head, "object": "chat.completion.chunk"}), "chat"))

    results = await run_until_disconnect(request, collect_all(start_streams(tm, choices, False)))
    body_choices = []
    for c, r in zip(choices, results):
        message, has_calls = ({"role": "assistant", "content": r.text}, False) \
            if plan.mode == "none" else tool_message(plan, r.text)
        body_choices.append({
            "index": c.index,
            "message": message,
            "logprobs": _logprobs(tm, req, r.logprobs),
            "finish_reason": _finish_reason(r.finish_reason, has_calls),
            "stop_reason": r.matched_stop,
            **token_id_fields(req.return_token_ids, c.input_ids, r.token_ids),
        })
    extra = {} if req.prompt_logprobs is None else {  # vLLM: on the response, not a choice
        "prompt_logprobs": vllm_prompt_logprobs(results[0].prompt_logprobs, tm.token_str,
                                                req.prompt_logprobs)}
    return JSONResponse({**head, "object": "chat.completion", "choices": body_choices,
                         "usage": usage_of(choices, results), **extra})


def _finish_reason(reason: str | None, has_calls: bool) -> str | None:
    return "tool_calls" if has_calls and reason == "stop" else reason


def _logprobs(tm: TokenizerManager, req: ChatCompletionRequest, lps: list[Any] | None) -> Any:
    if not req.logprobs:
        return None
    return chat_logprobs(lps or [], tm.token_str, req.top_logprobs or 0)


async def _stream(tm: TokenizerManager, req: ChatCompletionRequest, plan: ToolPlan,
                  choices: list[Choice], streams: list[AsyncGenerator[ReqStrOut, None]],
                  head: dict[str, Any]) -> AsyncIterator[str]:
    results = [ChoiceResult() for _ in choices]

    def chunk(index: int, delta: dict[str, Any], logprobs: Any = None,
              finish_reason: str | None = None, stop_reason: Any = None,
              extra: dict[str, Any] | None = None) -> str:
        choice = {"index": index, "delta": delta, "logprobs": logprobs,
                  "finish_reason": finish_reason, **(extra or {})}
        if finish_reason is not None:
            choice["stop_reason"] = stop_reason
        event = {**head, "choices": [choice]}
        if req.continuous_usage:
            event["usage"] = usage_of(choices, results)
        return sse_event(event)

    # OpenAI's first chunk of every choice carries only the role.
    for c in choices:
        yield chunk(c.index, {"role": "assistant", "content": ""},
                    extra=token_id_fields(req.return_token_ids, c.input_ids, []))
    tool_deltas = [None if (s := plan.stream()) is None else ToolDeltas(s) for _ in choices]
    async with aclosing(merge_streams(streams)) as merged:
        async for k, out in merged:
            results[k].add(out)
            td = tool_deltas[k]
            finished = out.finish_reason is not None
            if td is not None:
                delta = td.feed(out.text_delta, final=finished)
                reason = _finish_reason(out.finish_reason, td.has_calls)
            else:
                delta = {"content": out.text_delta} if out.text_delta else {}
                reason = out.finish_reason
            if not delta and not finished and not out.logprobs:
                continue
            yield chunk(choices[k].index, delta, _logprobs(tm, req, out.logprobs),
                        reason, out.matched_stop,
                        token_id_fields(req.return_token_ids, None, out.token_ids_delta))
    if req.include_usage:
        yield sse_event({**head, "choices": [], "usage": usage_of(choices, results)})
