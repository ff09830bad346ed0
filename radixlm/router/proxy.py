"""Forwarding one request to a worker: retries, streaming pass-through, load accounting.

Unary requests (non-streaming, GET): a connection failure, a timeout while connecting,
a 5xx answer, or a 429 (the worker's queue is full: it sheds load; it stays in rotation)
sends the request to another worker, up to `--max-retries` times; when every try fails
the client gets the last worker's 5xx / 429 (with its Retry-After), or a 503 naming the
errors.

Streaming requests retry the same way until the worker sends its status line. After
that the router passes bytes through chunk by chunk; if the worker dies mid-stream the
client gets an OpenAI-style error event and `data: [DONE]`, never a hang (a silent
worker trips the read timeout, which ends the stream the same way). A request `pinned`
to one worker (it holds a stored response: router/responses.py) is tried there alone.
Load: each try holds a `LoadGuard` on its worker from the moment it is chosen until its
answer is read, its stream ends, the client hangs up (cancellation), or it fails.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

import httpx
from starlette.requests import Request
from starlette.responses import Response

from radixlm.router.router import Router
from radixlm.router.workers import LoadGuard, Worker
from radixlm.server.errors import error_body, error_response
from radixlm.server.http_util import SSE_DONE, SSEResponse, run_until_disconnect

logger = logging.getLogger(__name__)

_FORWARDED_HEADERS = ("authorization", "content-type", "accept")


def forwarded_headers(request: Request) -> dict[str, str]:
    return {k: v for k, v in request.headers.items() if k.lower() in _FORWARDED_HEADERS}


def _no_worker(errors: list[str]) -> Response:
    detail = "; ".join(errors) if errors else "no healthy worker"
    return error_response(503, f"No worker could serve the request: {detail}")


def _is_retryable(e: httpx.HTTPError) -> bool:
    """Errors after which the request certainly or probably did not run to completion on
    the worker and may be sent elsewhere. A read timeout is not one: the worker may still
    be computing, and sending it again would double the work."""
    return isinstance(e, httpx.TransportError) and not isinstance(e, httpx.ReadTimeout)


def _takes_out(e: httpx.HTTPError) -> bool:
    """The worker is unreachable (nothing listens, or the connection broke before any
    answer): take it out of rotation until a health check passes."""
    return isinstance(e, (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError))


# Worker answers after which another worker may take the request: it did not run there.
OVERLOADED = 429


def _passthrough(resp: httpx.Response, content: bytes) -> Response:
    out = Response(content, status_code=resp.status_code,
                   media_type=resp.headers.get("content-type", "application/json"))
    if "retry-after" in resp.headers:
        out.headers["Retry-After"] = resp.headers["retry-after"]
    return out


@dataclass
class _Attempts:
    """The retry loop both proxies share: iterate to get the workers to try, in routing
    order, each at most once, up to --max-retries retries; report each failure; `final()`
    is the answer when every try failed (the last 5xx, or a 503 naming the errors)."""
    router: Router
    text: str | None
    pinned: Worker | None = None
    errors: list[str] = field(default_factory=list)
    last_5xx: Response | None = None

    def __iter__(self) -> Iterator[Worker]:
        if self.pinned is not None:
            yield self.pinned
            return
        tried: set[str] = set()
        for attempt in range(self.router.args.max_retries + 1):
            decision = self.router.select(self.text, exclude=tried)
            if decision is None:
                return
            tried.add(decision.worker.url)
            if attempt:
                self.router.metrics.retries.inc()
            yield decision.worker

    def connection_failed(self, worker: Worker, e: httpx.HTTPError) -> Response | None:
        """None: try the next worker; else the answer to give (a read timeout: the worker
        may still be computing, so the request is not sent again)."""
        self.router.worker_failed(worker, f"{type(e).__name__}: {e}", _takes_out(e))
        self.errors.append(f"{worker.url}: {type(e).__name__}")
        return None if _is_retryable(e) else error_response(504, f"Worker {worker.url} timed out.")

    def server_error(self, worker: Worker, resp: httpx.Response, content: bytes) -> None:
        self.router.worker_failed(worker, f"HTTP {resp.status_code}", take_out=False)
        self.errors.append(f"{worker.url}: HTTP {resp.status_code}")
        self.last_5xx = _passthrough(resp, content)

    def overloaded(self, worker: Worker, resp: httpx.Response, content: bytes) -> None:
        """A 429: the worker sheds load. Not a failure (it stays healthy and in rotation);
        the request goes to the next worker, or this answer is the last word."""
        self.errors.append(f"{worker.url}: HTTP {resp.status_code}")
        self.router.metrics.overloaded.inc()
        self.last_5xx = _passthrough(resp, content)

    def final(self) -> Response:
        return self.last_5xx if self.last_5xx is not None else _no_worker(self.errors)


async def forward_unary(router: Router, request: Request, method: str, path: str,
                        body: bytes, text: str | None, pinned: Worker | None = None,
                        on_ok: Callable[[str, bytes], None] | None = None) -> Response:
    """Send `method path` with `body` to a worker chosen for `text` (None: any worker, see
    `Router.select`), or to `pinned` alone; retry as above. `on_ok(worker URL, body)` sees
    a 200 answer before it is passed on."""

    async def attempt_all() -> Response:
        attempts = _Attempts(router, text, pinned)
        for worker in attempts:
            async with router.registry.guard(worker):
                try:
                    resp = await router.http().request(method, worker.url + path, content=body,
                                                       headers=forwarded_headers(request))
                except httpx.HTTPError as e:
                    if (answer := attempts.connection_failed(worker, e)) is not None:
                        return answer
                    continue
            if resp.status_code == OVERLOADED:
                attempts.overloaded(worker, resp, resp.content)
                continue
            if resp.status_code >= 500:
                attempts.server_error(worker, resp, resp.content)
                continue
            if on_ok is not None and resp.status_code == 200:
                on_ok(worker.url, resp.content)
            return _passthrough(resp, resp.content)
        return attempts.final()

    # Cancelled when the client hangs up: the guard is released, the httpx request is
    # closed, and the worker sees the disconnect and aborts the generation.
    return await run_until_disconnect(request, attempt_all())


async def forward_stream(router: Router, request: Request, path: str, body: bytes,
                         text: str, pinned: Worker | None = None,
                         sniff: Callable[[str], Callable[[bytes], None]] | None = None
                         ) -> Response:
    """POST a streaming request; pass the worker's SSE stream through. `sniff(worker URL)`,
    for a 200 stream, gives a function fed every chunk passed on."""
    attempts = _Attempts(router, text, pinned)
    for worker in attempts:
        guard = router.registry.guard(worker).acquire()
        try:
            req = router.http().build_request("POST", worker.url + path, content=body,
                                              headers=forwarded_headers(request))
            resp = await router.http().send(req, stream=True)
        except httpx.HTTPError as e:
            guard.release()
            if (answer := attempts.connection_failed(worker, e)) is not None:
                return answer
            continue
        except BaseException:
            guard.release()
            raise
        if resp.status_code != 200:
            # An error answer (400, 401, 5xx) comes whole: read it, then retry or pass it on.
            try:
                content = await resp.aread()
            except httpx.HTTPError:
                content = json.dumps(error_body(502, "worker closed the connection")).encode()
            finally:
                await resp.aclose()
                guard.release()
            if resp.status_code == OVERLOADED:
                attempts.overloaded(worker, resp, content)
                continue
            if resp.status_code >= 500:
                attempts.server_error(worker, resp, content)
                continue
            return _passthrough(resp, content)
        feed = sniff(worker.url) if sniff is not None else None
        return SSEResponse(_relay(router, resp, guard, feed))
    return attempts.final()


async def _relay(router: Router, resp: httpx.Response, guard: LoadGuard,
                 feed: Callable[[bytes], None] | None = None) -> AsyncIterator[bytes]:
    """Yield the worker's body chunks as they come (each shown to `feed` first). Closed
    early (client gone) or not, the worker response is closed and the load released."""
    try:
        async for chunk in resp.aiter_raw():
            if feed is not None:
                feed(chunk)
            yield chunk
    except httpx.HTTPError as e:
        worker = guard.worker
        router.metrics.stream_errors.inc()
        router.worker_failed(worker, f"stream cut: {type(e).__name__}: {e}", _takes_out(e))
        message = (f"The worker serving this stream ({worker.url}) failed mid-way: "
                   f"{type(e).__name__}. The output above is incomplete.")
        # A chunk boundary may have cut an event: start on a fresh line.
        yield ("\n\ndata: " + json.dumps(error_body(503, message)) + "\n\n" + SSE_DONE).encode()
    finally:
        await resp.aclose()
        guard.release()
