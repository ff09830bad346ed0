"""The dashboard's routes: the page, its static files (uPlot vendored under static/vendor)
and the event stream.

The page and its static files carry no data and are open; `/dashboard/events` takes the
same API key as the rest of the API (the page sends it as a bearer token, from the URL
fragment `#key=...` or a prompt).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib.resources import files
from typing import Any

from fastapi import Depends, FastAPI
from starlette.requests import Request
from starlette.responses import FileResponse, Response, StreamingResponse
from starlette.staticfiles import StaticFiles

STATIC = files("radixlm.server.dashboard") / "static"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def page_response(name: str) -> FileResponse:
    return FileResponse(str(STATIC / name), media_type="text/html",
                        headers={"Cache-Control": "no-cache"})


def mount_static(app: FastAPI) -> None:
    app.mount("/dashboard/static", StaticFiles(directory=str(STATIC)), name="dashboard-static")


def install_event_stream(app: FastAPI, stream: Callable[[], Any],
                         check_key: Callable[[Request], Awaitable[None]]) -> None:
    """GET /dashboard/events: `stream()` is an async iterator of server-sent-event bytes."""

    # Not in /openapi.json: the page's own feed, an endless stream, not part of the API.
    @app.get("/dashboard/events", dependencies=[Depends(check_key)], include_in_schema=False)
    async def dashboard_events() -> Response:
        return StreamingResponse(stream(), media_type="text/event-stream", headers=SSE_HEADERS)


def install_dashboard(app: FastAPI, tm: Any, args: Any, model_name: str,
                      check_key: Callable[[Request], Awaitable[None]]) -> Any:
    """Add GET /dashboard, /dashboard/static/* and /dashboard/events to a server's app;
    returns its DashboardHub."""
    from radixlm.server.dashboard.hub import DashboardHub

    hub = DashboardHub(tm, args, model_name)

    @app.get("/dashboard", include_in_schema=False)
    async def dashboard() -> FileResponse:
        return page_response("dashboard.html")

    mount_static(app)
    install_event_stream(app, hub.stream, check_key)
    return hub
