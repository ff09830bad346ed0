"""`Ingress`: the OpenAI-compatible HTTP entry of the Ray Serve application.

Every path radixlm serve answers (/v1/completions, /v1/chat/completions, /generate,
/v1/responses, /v1/models, /tokenize, ...) is parsed once into a RoutedRequest
(routed_request.py) and sent through a Serve handle to the replica the request router
picks; the replica streams back the engine's status, headers and body (server-sent events
pass through chunk by chunk). Fanned out to every engine (engine_directory.py): GET
/server_info (with `pool` summing the counters, as `radixlm router` does) and POST
/flush_cache. A non-streaming request whose replica dies before the whole body reached the ingress is
sent again (nothing was sent to the client yet), with a growing pause, until
RETRY_DEADLINE_S: Serve may route to the dead replica until it learns of the death. A
stream cut by a dying replica ends with an OpenAI error event and `data: [DONE]`, as
through `radixlm router`.
No `from __future__ import annotations`: FastAPI reads the handlers' annotations.
"""

import asyncio
import json
import logging
import time
from typing import Any, AsyncIterator

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.exceptions import RayError
from ray.serve.handle import DeploymentHandle

from radixlm.ray import engine_directory
from radixlm.ray.routed_request import RoutedRequest, routed_request
from radixlm.server.errors import error_body
from radixlm.server.http_util import SSE_DONE

logger = logging.getLogger(__name__)

SUMMED_POOL_FIELDS = ("prompt_tokens_total", "cached_tokens_total", "running", "waiting")
RETRY_DEADLINE_S = 60.0  # how long a non-streaming request is retried after replica deaths
RETRY_BACKOFF_S = 0.5  # times the try number, capped at RETRY_BACKOFF_MAX_S
RETRY_BACKOFF_MAX_S = 4.0

api = FastAPI(title="radixlm on Ray Serve")


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(error_body(status, message), status_code=status)


@serve.ingress(api)
class Ingress:
    def __init__(self, engine: DeploymentHandle) -> None:
        self.engine = engine
        self.app_name = serve.get_replica_context().app_name
        self._client = httpx.AsyncClient(timeout=60.0)

    async def _start(self, req: RoutedRequest) -> tuple[Any, dict[str, Any]]:
        """Send `req`; the response generator and its first item (status, headers)."""
        gen = self.engine.options(stream=True).forward.remote(req)
        try:
            return gen, await gen.__anext__()
        except BaseException:
            gen.cancel()
            raise

    async def _fan_out(self, method: str, path: str) -> list[dict[str, Any]]:
        async def one(replica_id: str, url: str) -> dict[str, Any]:
            try:
                r = await self._client.request(method, url + path)
                return {"replica": replica_id, "url": url, "status": r.status_code,
                        "body": r.json()}
            except httpx.TransportError as e:  # a killed replica's engine: forget it
                engine_directory.forget(self.app_name, replica_id)
                return {"replica": replica_id, "url": url, "status": 503, "error": str(e)}

        engines = engine_directory.engines(self.app_name)
        return list(await asyncio.gather(*(one(k, v) for k, v in engines.items())))

    @api.get("/server_info")
    async def server_info(self) -> JSONResponse:
        engines = [e for e in await self._fan_out("GET", "/server_info") if e["status"] == 200]
        pools = [e["body"].get("pool") or {} for e in engines]
        pool = {k: sum(p.get(k, 0) for p in pools) for k in SUMMED_POOL_FIELDS}
        prompt = pool["prompt_tokens_total"]
        pool["cache_hit_rate"] = pool["cached_tokens_total"] / prompt if prompt else 0.0
        return JSONResponse({"pool": pool, "workers": engines})

    @api.post("/flush_cache")
    async def flush_cache(self) -> JSONResponse:
        results = [e for e in await self._fan_out("POST", "/flush_cache")
                   if "error" not in e]
        ok = bool(results) and all(e["status"] == 200 for e in results)
        return JSONResponse({"workers": results}, status_code=200 if ok else 503)

    @api.api_route("/{path:path}", methods=["GET", "POST", "DELETE"])
    async def forward(self, request: Request, path: str) -> Response:
        req = routed_request(request.method, "/" + path, request.url.query,
                             await request.body(), dict(request.headers))
        if req.stream:
            try:
                gen, head = await self._start(req)
            except RayError as e:
                logger.warning("replica failed before answering %s: %s", req.path, e)
                return _error(503, "the replica serving this request failed; retry")
            return StreamingResponse(self._relay(gen), status_code=head["status"],
                                     headers=head["headers"])
        deadline = time.monotonic() + RETRY_DEADLINE_S
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._exchange(req)
            except RayError as e:
                logger.warning("replica failed before answering %s (try %d): %s", req.path,
                               attempt, e)
                pause = min(RETRY_BACKOFF_S * attempt, RETRY_BACKOFF_MAX_S)
                if time.monotonic() + pause > deadline:
                    return _error(503, "the replica serving this request failed; retry")
                await asyncio.sleep(pause)

    async def _exchange(self, req: RoutedRequest) -> Response:
        """One try of a non-streaming request: the head and the whole body, or RayError."""
        gen, head = await self._start(req)
        try:
            body = b"".join([chunk async for chunk in gen])
        finally:
            gen.cancel()
        return Response(body, status_code=head["status"], headers=head["headers"])

    async def _relay(self, gen: Any) -> AsyncIterator[bytes]:
        try:
            async for chunk in gen:
                yield chunk
        except RayError as e:  # the replica died mid-stream: say so, as `radixlm router` does
            logger.warning("stream cut by a failed replica: %s", e)
            message = (f"The replica serving this stream failed mid-way: {type(e).__name__}. "
                       "The output above is incomplete.")
            # A chunk boundary may have cut an event: start on a fresh line.
            yield ("\n\ndata: " + json.dumps(error_body(503, message)) + "\n\n"
                   + SSE_DONE).encode()
        finally:
            gen.cancel()
