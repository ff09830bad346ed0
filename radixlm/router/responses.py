"""The Responses API through the router: POST /v1/responses (streaming or not) routed like
a chat request, GET/DELETE /v1/responses/{id} and a POST with `previous_response_id` sent
to the worker that stored that response (router/response_affinity.py).

Invariants: a request naming a stored response goes to one worker only, never retried
elsewhere (no other worker has it); the owner comes from the affinity map, else from
asking every healthy worker (GET /v1/responses/{id}: a router restarted, or the map's
LRU dropped it); no worker has it -> 404 with the workers' OpenAI-style body. A worker's
404 for an id, or a DELETE that succeeded, drops the id from the map.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from radixlm.router.proxy import forward_stream, forward_unary, forwarded_headers
from radixlm.router.request_text import routing_text
from radixlm.router.router import Router
from radixlm.router.workers import Worker
from radixlm.server.errors import error_response
from radixlm.server.http_util import ClientDisconnected

_CLIENT_CLOSED = 499
PATH = "/v1/responses"


def not_found(response_id: str, param: str | None = None) -> Response:
    """The body a worker gives for an unknown id (radixlm/server/responses/route.py)."""
    return error_response(404, f"Response with id '{response_id}' not found.", param)


async def locate(router: Router, request: Request, response_id: str) -> Worker | None:
    """The registered worker holding `response_id`, or None if no healthy one has it."""
    url = router.responses.worker_of(response_id)
    if url is not None:
        worker = router.registry.get(url)
        if worker is not None:
            return worker
        router.responses.forget(response_id)  # its worker left the router

    async def has_it(w: Worker) -> bool:
        try:
            r = await router.http().get(f"{w.url}{PATH}/{response_id}",
                                        headers=forwarded_headers(request))
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    workers = router.registry.healthy()
    found = await asyncio.gather(*(has_it(w) for w in workers))
    owner = next((w for w, ok in zip(workers, found) if ok), None)
    if owner is not None:
        router.responses.learn(response_id, owner.url)
    return owner


def install_responses_routes(app: FastAPI, router: Router, dependencies: list[Any]) -> None:
    affinity = router.responses

    async def guarded(call: Callable[[], Any]) -> Response:
        try:
            return await call()
        except ClientDisconnected:
            return Response(status_code=_CLIENT_CLOSED)

    @app.post(PATH, dependencies=dependencies)
    async def create(request: Request) -> Response:
        body = await request.body()
        try:
            parsed: Any = json.loads(body)
        except ValueError:
            parsed = None  # the worker answers with its own 4xx
        pinned = None
        prev = parsed.get("previous_response_id") if isinstance(parsed, dict) else None
        if isinstance(prev, str):
            pinned = await locate(router, request, prev)
            if pinned is None:
                resp = not_found(prev, "previous_response_id")
                router.metrics.responses.labels(PATH, "404").inc()
                return resp
        text = routing_text(PATH, parsed)
        if isinstance(parsed, dict) and parsed.get("stream") is True:
            resp = await guarded(lambda: forward_stream(
                router, request, PATH, body, text, pinned, affinity.stream_sniffer))
        else:
            resp = await guarded(lambda: forward_unary(
                router, request, "POST", PATH, body, text, pinned, affinity.learn_from_body))
        if pinned is not None and resp.status_code == 404:
            affinity.forget(prev)  # the owner's own store dropped it meanwhile
        router.metrics.responses.labels(PATH, str(resp.status_code)).inc()
        return resp

    async def to_owner(request: Request, method: str, response_id: str) -> Response:
        owner = await locate(router, request, response_id)
        if owner is None:
            return not_found(response_id)
        resp = await guarded(lambda: forward_unary(
            router, request, method, f"{PATH}/{response_id}", b"", None, owner))
        if resp.status_code == 404 or (method == "DELETE" and resp.status_code == 200):
            affinity.forget(response_id)
        return resp

    @app.get(PATH + "/{response_id}", dependencies=dependencies)
    async def get(request: Request, response_id: str) -> Response:
        return await to_owner(request, "GET", response_id)

    @app.delete(PATH + "/{response_id}", dependencies=dependencies)
    async def delete(request: Request, response_id: str) -> Response:
        return await to_owner(request, "DELETE", response_id)
