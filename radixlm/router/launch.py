"""Run the router: build its state and app, serve with uvicorn until interrupted."""

from __future__ import annotations

import logging

from radixlm.router.app import create_router_app
from radixlm.router.config import RouterArgs
from radixlm.router.dashboard import RouterServer
from radixlm.router.router import Router

logger = logging.getLogger(__name__)


def run_router(args: RouterArgs, worker_urls: list[str]) -> None:
    import uvicorn

    # httpx logs every request at INFO: one line per proxied request and health check.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    router = Router.create(args, worker_urls)
    logger.info("router on http://%s:%d, policy %s, workers: %s", args.host, args.port,
                args.policy, ", ".join(w.url for w in router.registry.all()) or "none")
    # A long keep-alive: clients (the openai SDK) reuse connections between requests.
    # h11 and asyncio whatever else is installed (ray[serve] brings httptools, uvloop).
    config = uvicorn.Config(create_router_app(router), host=args.host, port=args.port,
                            log_level=args.log_level, timeout_keep_alive=30, http="h11",
                            loop="asyncio")
    RouterServer(config, router).run()  # uvicorn's, ending /dashboard/events on exit
