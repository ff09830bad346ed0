"""The router's FastAPI app: the same endpoints as one instance, plus worker management.

Proxied: POST /v1/completions, /v1/chat/completions, /generate (streaming or not),
GET /v1/models; the Responses API with its id -> worker affinity (router/responses.py).
Fanned out to every worker: GET /server_info, POST /flush_cache.
Router's own: GET|HEAD /health (200 while at least one worker is in rotation), GET
/metrics (Prometheus), GET /workers, POST /workers {"url": ...}, DELETE /workers/{url}.
With --api-key every endpoint but /health needs the key (adding a worker would otherwise
let anyone redirect traffic).
The body is parsed once, only to find the routing text and the `stream` flag; it is
forwarded byte for byte, and the worker validates it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response

from radixlm.router.health import eviction_loop, health_loop
from radixlm.router.proxy import forward_stream, forward_unary, forwarded_headers
from radixlm.router.request_text import routing_text
from radixlm.router.responses import install_responses_routes
from radixlm.router.router import Router
from radixlm.router.workers import normalize_url
from radixlm.router.dashboard import install_router_dashboard
from radixlm.server.api_key import api_key_dependency
from radixlm.server.errors import APIError, error_response
from radixlm.server.http_util import ClientDisconnected

logger = logging.getLogger(__name__)

_CLIENT_CLOSED = 499
_PROXIED_POSTS = ("/v1/completions", "/v1/chat/completions", "/generate")
_SUMMED_POOL_FIELDS = ("prompt_tokens_total", "cached_tokens_total", "running", "waiting")


def create_router_app(router: Router) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own_client = router.client is None  # tests inject one with a mock transport
        if own_client:
            timeout = httpx.Timeout(router.args.request_timeout_s, connect=10.0)
            # No connection cap: every request in flight holds one connection (streams).
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
            router.client = httpx.AsyncClient(timeout=timeout, limits=limits)
        tasks = [asyncio.create_task(health_loop(router)),
                 asyncio.create_task(eviction_loop(router))]
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if own_client:
                await router.client.aclose()
                router.client = None

    # Every route but /health: the API key (none configured: open).
    app = FastAPI(title="radixlm router", lifespan=lifespan)
    keyed = [Depends(api_key_dependency(router.args.api_key))]

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError) -> JSONResponse:
        return error_response(e.status, e.message, e.param)

    async def proxy_post(request: Request) -> Response:
        path = request.url.path
        body = await request.body()
        try:
            parsed: Any = json.loads(body)
        except ValueError:
            parsed = None  # the worker answers with its own 400
        text = routing_text(path, parsed)
        stream = isinstance(parsed, dict) and parsed.get("stream") is True
        try:
            if stream:
                resp = await forward_stream(router, request, path, body, text)
            else:
                resp = await forward_unary(router, request, "POST", path, body, text)
        except ClientDisconnected:
            resp = Response(status_code=_CLIENT_CLOSED)
        router.metrics.responses.labels(path, str(resp.status_code)).inc()
        return resp

    for path in _PROXIED_POSTS:
        app.add_api_route(path, proxy_post, methods=["POST"], dependencies=keyed)
    install_responses_routes(app, router, keyed)

    @app.get("/v1/models", dependencies=keyed)
    async def models(request: Request) -> Response:
        try:
            return await forward_unary(router, request, "GET", "/v1/models", b"", None)
        except ClientDisconnected:
            return Response(status_code=_CLIENT_CLOSED)

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> Response:
        n = len(router.registry.healthy())
        if n:
            return JSONResponse({"status": "ok", "healthy_workers": n})
        return error_response(503, "No worker is healthy.")

    @app.get("/metrics", dependencies=keyed)
    async def metrics() -> Response:
        router.refresh_worker_metrics()
        return Response(router.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    def worker_list() -> list[dict[str, Any]]:
        return [{"url": w.url, "healthy": w.healthy, "load": w.load}
                for w in router.registry.all()]

    @app.get("/workers", dependencies=keyed)
    async def list_workers() -> JSONResponse:
        return JSONResponse({"workers": worker_list(), "policy": router.policy.name})

    @app.post("/workers", dependencies=keyed)
    async def add_worker(request: Request) -> Response:
        try:
            url = json.loads(await request.body())["url"]
            assert isinstance(url, str) and url.strip()
        except (ValueError, KeyError, TypeError, AssertionError):
            return error_response(400, 'Expected a JSON body {"url": "http://host:port"}.', "url")
        worker = router.registry.add(url)
        logger.info("worker %s added", worker.url)
        return JSONResponse({"added": worker.url, "workers": worker_list()})

    @app.delete("/workers/{url:path}", dependencies=keyed)
    async def remove_worker(url: str) -> Response:
        url = normalize_url(url)
        if not router.registry.remove(url):
            return error_response(404, f"No worker {url}.")
        router.metrics.drop_worker(url)
        logger.info("worker %s removed", url)
        return JSONResponse({"removed": url, "workers": worker_list()})

    async def fan_out(request: Request, method: str, path: str) -> list[dict[str, Any]]:
        async def one(url: str) -> dict[str, Any]:
            try:
                r = await router.http().request(method, url + path,
                                                headers=forwarded_headers(request))
                return {"url": url, "status": r.status_code, "body": r.json()}
            except (httpx.HTTPError, ValueError) as e:
                return {"url": url, "status": 503, "error": f"{type(e).__name__}: {e}"}

        return list(await asyncio.gather(*(one(w.url) for w in router.registry.healthy())))

    @app.get("/server_info", dependencies=keyed)
    async def server_info(request: Request) -> JSONResponse:
        """Every worker's /server_info, and `pool` summing the counters that add up
        across workers (so a client reading one instance's cache hit rate reads the
        whole fleet's through the router)."""
        workers = await fan_out(request, "GET", "/server_info")
        pools = [w["body"]["pool"] for w in workers
                 if w["status"] == 200 and isinstance(w["body"].get("pool"), dict)]
        pool = {k: sum(p.get(k, 0) for p in pools) for k in _SUMMED_POOL_FIELDS}
        prompt = pool["prompt_tokens_total"]
        pool["cache_hit_rate"] = pool["cached_tokens_total"] / prompt if prompt else 0.0
        return JSONResponse({"policy": router.policy.name, "pool": pool, "workers": workers})

    # GET /dashboard (open) and /dashboard/events (behind the key): router/dashboard.py.
    app.state.dashboard = install_router_dashboard(app, router, keyed[0].dependency)

    @app.post("/flush_cache", dependencies=keyed)
    async def flush_cache(request: Request) -> JSONResponse:
        results = await fan_out(request, "POST", "/flush_cache")
        for w in router.registry.all():  # the workers' caches are empty: so are the trees
            router.policy.forget_worker(w.url)
        ok = all(r["status"] == 200 for r in results)
        return JSONResponse({"workers": results}, status_code=200 if ok else 503)

    return app
