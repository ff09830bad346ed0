"""POST /v1/responses: run the request through the chat completions path and answer in
the Responses API's shapes (objects.py, stream.py).

Invariants: nothing here generates on its own: the chat handler does the tokenizing,
tool plans, constraints and admission-counted generation; a stored response (store true)
enters the ResponseStore only once it has finished; an unknown previous_response_id is a
404 before anything runs.
"""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi.responses import JSONResponse
from starlette.requests import Request
from starlette.responses import Response

from radixlm.server.chat import create_chat_completion
from radixlm.constrained.constraint import ConstraintError
from radixlm.server.errors import APIError, GenerateError
from radixlm.server.http_util import SSEResponse
from radixlm.server.responses.objects import (conversation_after, new_id,
                                              output_of_chat_message, response_body, status_of,
                                              usage_of)
from radixlm.server.responses.request import ResponsesRequest, responses_field_names
from radixlm.server.responses.store import ResponseStore, StoredResponse
from radixlm.server.responses.stream import ResponseEvents, response_events
from radixlm.server.tokenizer_manager import TokenizerManager


def not_found(response_id: str, param: str | None = None) -> APIError:
    return APIError(404, f"Response with id '{response_id}' not found.", param)


async def create_response(tm: TokenizerManager, req: ResponsesRequest, model_name: str,
                          request: Request, store: ResponseStore) -> Response:
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        prev = store.get(req.previous_response_id)
        if prev is None:
            raise not_found(req.previous_response_id, "previous_response_id")
        history = prev.messages
    stream = bool(req.stream)
    chat_req = req.chat_request(history, stream)
    # The conversation a follow-up continues: without `instructions` (as OpenAI's).
    conversation = history + req.input_messages()
    rid, created = new_id("resp"), int(time.time())
    model = req.model or model_name

    def body_of(output: list[dict[str, Any]], status: str,
                usage: dict[str, Any] | None) -> dict[str, Any]:
        return response_body(rid, created, model, req, output, status, usage)

    def keep(body: dict[str, Any]) -> None:
        if req.store is not False:
            store.put(rid, StoredResponse(body, conversation_after(conversation,
                                                                   body["output"])))

    try:
        chat_resp = await create_chat_completion(tm, chat_req, model_name, request)
    except (APIError, ConstraintError, GenerateError) as e:
        raise _renamed(e) from e
    if not stream:
        chat = json.loads(bytes(chat_resp.body))
        choice = chat["choices"][0]
        output = output_of_chat_message(choice["message"])
        body = body_of(output, status_of(choice["finish_reason"]), usage_of(chat["usage"]))
        keep(body)
        return JSONResponse(body)
    assert isinstance(chat_resp, SSEResponse)
    start = body_of([], "in_progress", None)
    events = ResponseEvents(dict(start), body_of)
    return SSEResponse(response_events(chat_resp.body_iterator, events, start, keep))


def _renamed(e: APIError | ConstraintError | GenerateError) -> Exception:
    """`e` again, its message and param naming the Responses API's fields."""
    message = responses_field_names(str(e)) or ""
    if isinstance(e, APIError):
        return APIError(e.status, message, responses_field_names(e.param))
    if isinstance(e, ConstraintError):
        return ConstraintError(message, responses_field_names(e.param))
    return GenerateError(message, e.status)


def get_response(store: ResponseStore, response_id: str) -> JSONResponse:
    item = store.get(response_id)
    if item is None:
        raise not_found(response_id)
    return JSONResponse(item.body)


def delete_response(store: ResponseStore, response_id: str) -> JSONResponse:
    if not store.delete(response_id):
        raise not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})
