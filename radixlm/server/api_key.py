"""`Authorization: Bearer <key>` checking, shared by the server and the router.

A FastAPI dependency: routes that take it answer 401 (OpenAI-style body, via the app's
APIError handler) unless the request carries the key; with no key configured every request
passes. /health is left without it on purpose (launchers and load balancers poll it).
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable

from starlette.requests import Request

from radixlm.server.errors import APIError


def has_api_key(request: Request, api_key: str) -> bool:
    """The request's bearer token equals `api_key` (compared in constant time)."""
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(key.strip().encode(),
                                                                 api_key.encode())


def api_key_dependency(api_key: str | None) -> Callable[[Request], Awaitable[None]]:
    async def check_api_key(request: Request) -> None:
        if api_key is not None and not has_api_key(request, api_key):
            raise APIError(401, "Invalid or missing API key: send 'Authorization: Bearer <key>'.")
    return check_api_key
