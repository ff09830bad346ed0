"""The FastAPI app: OpenAI-compatible routes, the native /generate, /health.

`create_app` closes over one TokenizerManager; there is no module-level state. The app's
lifespan starts the TokenizerManager on uvicorn's event loop and stops it on shutdown.

Every error is an OpenAI-style body (`errors.error_body`): invalid input is a 400, a
missing or wrong API key a 401, anything unexpected a 500 (logged); none of them affects
later requests.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

from fastapi import APIRouter, Depends, FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from radixlm.config import ServerArgs
from radixlm.constrained.validate import warm_up as warm_up_constraint_checks
from radixlm.runtime.process_threads import current_torch_threads
from radixlm.server.admission import QueueFull, choice_count
from radixlm.server.api_key import api_key_dependency
from radixlm.server.chat import create_chat_completion
from radixlm.server.completions import create_completion
from radixlm.server.dashboard import install_dashboard
from radixlm.server.errors import (APIError, GenerateError, error_response, param_of_value_error,
                                   validation_message)
from radixlm.server.extensions import (DetokenizeRequest, TokenizeRequest, extension_routes,
                                       model_card)
from radixlm.server.http_util import ClientDisconnected, SSEResponse, check_json_body
from radixlm.server.grammar_metrics import GRAMMAR_METRICS
from radixlm.server.spec_metrics import SPEC_METRICS
from radixlm.server.metrics import CONTENT_TYPE_LATEST, EngineMetrics, Snapshot
from radixlm.server.native import generate_native
from radixlm.server.openapi_bodies import install_request_bodies
from radixlm.server.openapi_responses import error_responses, install_responses
from radixlm.server.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest
from radixlm.server.responses.request import ResponsesRequest
from radixlm.server.responses.route import create_response, delete_response, get_response
from radixlm.server.responses.store import ResponseStore
from radixlm.server.server_info import get_server_info_body
from radixlm.server.tokenizer_manager import TokenizerManager

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

# Not an HTTP status a client sees (it is gone); logged by uvicorn, as nginx does.
_CLIENT_CLOSED = 499


async def handle(request: Request, model: type[M], run: Callable[[M], Awaitable[Response]],
                 tm: TokenizerManager) -> Response:
    """Parse the JSON body into `model`, admit it (admission.py: 503 draining, 429 queue
    full; checked and counted in one step), run the handler, map exceptions to responses.
    The admitted choices are released once the answer is sent (a stream: once it ends)."""
    admitted = 0
    try:
        check_json_body(request)
        req = model.model_validate_json(await request.body())
        admitted = tm.admission.admit(choice_count(req))
        resp = await run(req)
        if isinstance(resp, SSEResponse):
            resp.on_close.append(functools.partial(tm.admission.release, admitted))
            admitted = 0
        return resp
    except QueueFull as e:
        resp = error_response(e.status, e.message, e.param)
        resp.headers["Retry-After"] = str(e.retry_after_s)
        return resp
    except ValidationError as e:  # before ValueError: it is one
        message, param = validation_message(e)
        return error_response(400, message, param)
    except APIError as e:
        return error_response(e.status, e.message, e.param)
    except ValueError as e:
        param = getattr(e, "param", None) or param_of_value_error(str(e))
        return error_response(400, str(e), param)
    except GenerateError as e:
        return error_response(e.status, str(e))
    except ClientDisconnected:
        return Response(status_code=_CLIENT_CLOSED)
    except Exception as e:
        logger.exception("internal error in %s", request.url.path)
        return error_response(500, f"Internal server error: {type(e).__name__}: {e}")
    finally:
        tm.admission.release(admitted)


def create_app(tokenizer_manager: TokenizerManager, args: ServerArgs, model_name: str) -> FastAPI:
    tm = tokenizer_manager
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        warm_up_constraint_checks()  # imports xgrammar off the event loop
        await tm.start()
        try:
            yield
        finally:
            await tm.stop()

    app = FastAPI(title="radixlm", lifespan=lifespan)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError) -> JSONResponse:
        return error_response(e.status, e.message, e.param)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
        return error_response(400, str(e.errors()[:3]))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        return error_response(e.status_code, str(e.detail))

    # /health stays open without a key: the launcher and load balancers poll it. HEAD is
    # the same handler, left out of the schema (one operation per route id).
    @app.get("/health")
    async def health() -> Response:
        if tm.admission.draining:
            return error_response(503, "The server is draining before shutting down.")
        if tm.is_healthy():
            return JSONResponse({"status": "ok"})
        return error_response(503, "The engine is not healthy (a child process died).")

    app.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)

    api = APIRouter(dependencies=[Depends(api_key_dependency(args.api_key))])

    @api.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list",
                             "data": [model_card(model_name, created, tm.context_len)]})

    @api.get("/server_info")
    async def server_info() -> JSONResponse:
        """Limits, live KV pool state and radix cache statistics (SGLang's
        /get_server_info, trimmed): `pool` is the scheduler's PoolStats -- slots free / held
        by requests / held by the cache, the page size, and prompt_tokens_total,
        cached_tokens_total, cache_hit_rate over every admitted request."""
        stats = await tm.pool_stats()
        return JSONResponse({"model": model_name, "context_len": tm.context_len,
                             "enable_mixed_chunk": args.enable_mixed_chunk,
                             "dtype": tm.dtype, "pool": dataclasses.asdict(stats)})

    @api.get("/get_server_info")
    async def get_server_info() -> JSONResponse:
        """Server args, the memory plan (three pools), the resolved dtype, the thread
        counts and the live pool state."""
        stats = await tm.pool_stats()
        threads = {"scheduler": tm.scheduler_threads, "api": current_torch_threads()}
        return JSONResponse(get_server_info_body(args, model_name, tm.context_len,
                                                 tm.max_running_requests, tm.memory_plan, stats,
                                                 tm.cuda_graph_batch_sizes, tm.dtype, threads))

    metrics = EngineMetrics(model_name, [*tm.admission.metric_defs(lambda: tm.num_running),
                                         *GRAMMAR_METRICS, *SPEC_METRICS])

    @api.get("/metrics", response_class=PlainTextResponse)
    async def prometheus_metrics() -> Response:
        """Prometheus text format (radixlm/server/metrics.py); pool gauges are left out
        and radixlm_scheduler_up is 0 when the scheduler does not answer in 5 s."""
        try:
            stats = await tm.pool_stats(timeout=5.0)
        except TimeoutError:
            stats = None
        snap = Snapshot(tm.memory_plan, stats, tm.requests_finished_total,
                        tm.prompt_tokens_total, tm.generation_tokens_total,
                        tm.max_running_requests)
        return Response(metrics.render(snap), media_type=CONTENT_TYPE_LATEST)

    @api.post("/flush_cache")
    async def flush_cache(storage: bool = False) -> Response:
        # ?storage=true: also delete the hierarchical cache's stored blocks.
        result = await tm.flush_cache(storage=storage)
        if not result.success:
            return error_response(400, result.message)
        return JSONResponse({"message": result.message})

    @api.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await handle(request, CompletionRequest,
                            lambda req: create_completion(tm, req, model_name, request), tm)

    @api.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await handle(request, ChatCompletionRequest,
                            lambda req: create_chat_completion(tm, req, model_name, request), tm)

    @api.post("/generate")
    async def generate(request: Request) -> Response:
        return await handle(request, GenerateRequest,
                            lambda req: generate_native(tm, req, request), tm)

    api.include_router(extension_routes(tm, model_name, created))
    responses_store = ResponseStore(args.responses_store_size)

    @api.post("/v1/responses", responses=error_responses(404))
    async def responses(request: Request) -> Response:
        """OpenAI's Responses API over the chat path (radixlm/server/responses/)."""
        return await handle(request, ResponsesRequest, lambda req: create_response(
            tm, req, model_name, request, responses_store), tm)

    @api.get("/v1/responses/{response_id}", responses=error_responses(404))
    async def responses_get(response_id: str) -> Response:
        return get_response(responses_store, response_id)

    @api.delete("/v1/responses/{response_id}", responses=error_responses(404))
    async def responses_delete(response_id: str) -> Response:
        return delete_response(responses_store, response_id)

    app.include_router(api)
    # GET /dashboard (open) and /dashboard/events (behind the key): server/dashboard/.
    app.state.dashboard = install_dashboard(app, tm, args, model_name,
                                            api_key_dependency(args.api_key))
    install_request_bodies(app, {"/v1/completions": CompletionRequest,
                                 "/v1/chat/completions": ChatCompletionRequest,
                                 "/generate": GenerateRequest,
                                 "/v1/responses": ResponsesRequest,
                                 "/tokenize": TokenizeRequest,
                                 "/detokenize": DetokenizeRequest})
    install_responses(app)  # last: documents the statuses of every route above
    return app
