"""Responses in the OpenAPI schema (/openapi.json): every status and content type served.

FastAPI documents only a route's 200 (JSON) and a 422 the server never sends (validation
errors answer 400). `install_responses` rewrites each operation's responses by rule, so
routes added later are covered without a list of paths here:
  * every error is `ErrorResponse` JSON (`errors.py`): 500 and 503 (draining, a dead
    child) on every operation; 401 behind the API-key dependency; 400 where it takes
    parameters or a body; 415 where it takes a JSON body;
  * a body with a `stream` field is a generation request: 408 (timeout), 429 with a
    required Retry-After header, 507 (a lone request out of memory), and its 200 may be
    `text/event-stream`;
  * a route's own `responses=` entries (`error_responses(404)`) are kept; 422 is removed.
Invariant: tests/e2e/test_api_fuzz.py runs schemathesis's conformance checks over every
operation of this schema.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute

from radixlm.server.errors import _TYPES

ERROR_REF = "#/components/schemas/ErrorResponse"
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                       "code": {"type": "integer"}}}},
}
_DESCRIPTIONS = {
    400: "Invalid request (malformed JSON, a field out of range, an invalid grammar)",
    401: "Missing or wrong API key (servers started with --api-key)",
    404: "Not found (the message names what)",
    408: "The request timed out (its `timeout` or --request-timeout) and was aborted",
    429: "The waiting queue is full: retry after Retry-After seconds",
    415: "The body is not JSON (Content-Type)",
    500: "Internal server error",
    503: "Draining before shutdown, or a child process died",
    507: "This request's forward ran out of memory even alone (the message says which "
         "pool and which flag to change)",
}
_GENERATION_ERRORS = (408, 429, 507)
# One server-sent event as schema checkers (schemathesis) parse it: `data: {json}` events,
# the last one `data: [DONE]`.
SSE_EVENT: dict[str, Any] = {
    "type": "object", "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"type": "string"},
                   "id": {"type": "string"}},
    "description": "`data: {json}` events ending with `data: [DONE]`"}


def _error(status: int) -> dict[str, Any]:
    resp: dict[str, Any] = {
        "description": _DESCRIPTIONS.get(status, _TYPES.get(status, "error")),
        "content": {"application/json": {"schema": {"$ref": ERROR_REF}}}}
    if status == 429:
        resp["headers"] = {"Retry-After": {"required": True, "description": "Seconds",
                                           "schema": {"type": "string"}}}
    return resp


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """A route's own error statuses (FastAPI's `responses=`), beyond those set by rule."""
    return {status: _error(status) for status in statuses}


def _has_stream_field(schema: dict[str, Any], op: dict[str, Any]) -> bool:
    ref = (op.get("requestBody", {}).get("content", {}).get("application/json", {})
           .get("schema", {}).get("$ref", ""))
    model = schema.get("components", {}).get("schemas", {}).get(ref.rsplit("/", 1)[-1], {})
    return "stream" in model.get("properties", {})


def document_responses(schema: dict[str, Any], guarded: set[tuple[str, str]]) -> None:
    """Rewrite `schema`'s responses in place; `guarded`: (METHOD, path) of the operations
    behind the API-key dependency."""
    schema.setdefault("components", {}).setdefault("schemas", {})["ErrorResponse"] = ERROR_SCHEMA
    for path, ops in schema.get("paths", {}).items():
        for method, op in ops.items():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            statuses = {500, 503}
            if (method.upper(), path) in guarded:
                statuses.add(401)
            if op.get("parameters") or op.get("requestBody"):
                statuses.add(400)
            if "application/json" in op.get("requestBody", {}).get("content", {}):
                statuses.add(415)
                if _has_stream_field(schema, op):  # a generation request
                    statuses.update(_GENERATION_ERRORS)
                    ok = responses.setdefault("200", {"description": "Successful Response"})
                    ok.setdefault("content", {}).setdefault(
                        "text/event-stream",
                        {"schema": SSE_EVENT})
            for status in sorted(statuses):
                responses.setdefault(str(status), _error(status))


def _api_routes(routes: Iterable[Any], prefix: str = "", guarded: bool = False
                ) -> Iterator[tuple[str, set[str], bool]]:
    """(path, methods, has dependencies) of every API route, included routers too (newer
    FastAPI keeps an included router as one entry holding the original router and the
    dependencies its includer gave it)."""
    for r in routes:
        if isinstance(r, APIRoute):
            yield prefix + r.path_format, set(r.methods), guarded or bool(r.dependant.dependencies)
        elif getattr(r, "original_router", None) is not None:
            ctx = getattr(r, "include_context", None)
            yield from _api_routes(r.original_router.routes,
                                   prefix + (getattr(ctx, "prefix", "") or ""),
                                   guarded or bool(getattr(ctx, "dependencies", None)))


def install_responses(app: FastAPI) -> None:
    """Wrap `app.openapi` (after every other schema hook) with `document_responses`."""
    generate = app.openapi
    documented: list[dict[str, Any]] = []  # the schema, once rewritten

    def openapi() -> dict[str, Any]:
        if not documented:
            schema = generate()
            guarded = {(m, path) for path, methods, deps in _api_routes(app.routes) if deps
                       for m in methods}
            document_responses(schema, guarded)
            app.openapi_schema = schema
            documented.append(schema)
        return documented[0]

    app.openapi = openapi  # type: ignore[method-assign]
