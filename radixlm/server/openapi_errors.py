"""The error answers of a route, for the OpenAPI schema (FastAPI's `responses=`).

Every error body is `errors.error_body`'s shape; `error_responses(400, 429, ...)` documents
those statuses with it, so schema-driven checks (schemathesis) know every status a route
may answer.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorBody(BaseModel):
    error: ErrorDetail


_WHY = {
    400: "Invalid request (the message and param name the field).",
    401: "Missing or wrong API key.",
    404: "Not found.",
    408: "The request's deadline passed.",
    415: "The body is not JSON (Content-Type).",
    429: "The queue is full; retry after the Retry-After seconds.",
    500: "Internal error.",
    503: "The server is draining before shutting down.",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        entry: dict[str, Any] = {"model": ErrorBody, "description": _WHY.get(status, "Error.")}
        if status == 429:
            entry["headers"] = {"Retry-After": {"description": "Seconds to wait.",
                                                "schema": {"type": "integer"}}}
        out[status] = entry
    return out
