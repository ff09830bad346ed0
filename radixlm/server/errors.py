"""OpenAI-style error bodies and the exceptions the handlers map to them.

Every error the HTTP layer returns has the shape
`{"error": {"message", "type", "param", "code"}}`, with `code` equal to the HTTP status.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import ValidationError

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    408: "timeout_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    503: "service_unavailable",
    507: "insufficient_storage",
}


class APIError(Exception):
    """An error with an HTTP status, raised anywhere in a handler."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


class GenerateError(RuntimeError):
    """The engine reported an error for a request (`ReqStrOut.error`); `status` is its
    HTTP status (`ReqStrOut.error_status`; 500 unless the engine says otherwise, e.g. 400
    for an invalid grammar, 507 for a lone request whose forward ran out of memory)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status or 500


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _TYPES.get(status, "error"),
                      "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status)


def validation_message(err: ValidationError) -> tuple[str, str | None]:
    """A readable one-line message and the offending parameter of a pydantic error."""
    parts: list[str] = []
    param: str | None = None
    for e in err.errors(include_url=False)[:3]:
        # Union members add their type names to `loc` ("prompt", "list[int]", 0): keep
        # only field names and indices so the message names what the user wrote.
        loc = [str(x) for x in e["loc"] if isinstance(x, int) or _is_field_name(x)]
        where = ".".join(loc)
        if param is None and loc:
            param = loc[0]
        if e["type"] == "json_invalid":
            parts.append(f"Malformed JSON body: {e['msg']}")
        else:
            msg = e["msg"].removeprefix("Value error, ")  # from our model validators
            parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts) or "Invalid request", param


def _is_field_name(x: Any) -> bool:
    return isinstance(x, str) and x.replace("_", "").isalnum()


def param_of_value_error(message: str) -> str | None:
    """`SamplingParams.validate` messages start with the field name ("top_p must be ...")."""
    first = message.split(" ", 1)[0]
    return first if _is_field_name(first) and first.islower() else None


def stream_error_status(e: Exception) -> int:
    """The status an error met while streaming would have had (it is sent in-band)."""
    if isinstance(e, GenerateError):
        return e.status
    return 400 if isinstance(e, ValueError) else 500
