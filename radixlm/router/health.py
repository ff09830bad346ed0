"""Background loops of the router: worker health checks and cache_aware tree eviction."""

from __future__ import annotations

import asyncio
import logging

import httpx

from radixlm.router.router import Router
from radixlm.router.workers import Worker

logger = logging.getLogger(__name__)


async def check_worker(router: Router, worker: Worker) -> bool:
    """GET /health once; update the worker's counters and, past a threshold, its state.
    Returns whether the check passed."""
    try:
        resp = await router.http().get(worker.url + "/health",
                                       timeout=router.args.health_check_timeout_s)
        ok = resp.status_code == 200
    except httpx.HTTPError:
        ok = False
    args = router.args
    if ok:
        worker.consecutive_failures = 0
        if not worker.healthy:
            worker.consecutive_successes += 1
            if worker.consecutive_successes >= args.health_success_threshold:
                router.registry.set_healthy(worker.url, True)
                logger.info("worker %s is healthy again: back in rotation", worker.url)
    else:
        worker.consecutive_successes = 0
        if worker.healthy:
            worker.consecutive_failures += 1
            if worker.consecutive_failures >= args.health_failure_threshold:
                router.registry.set_healthy(worker.url, False)
                logger.warning("worker %s failed %d health checks: out of rotation",
                               worker.url, args.health_failure_threshold)
    return ok


async def health_loop(router: Router) -> None:
    while True:
        await asyncio.gather(*(check_worker(router, w) for w in router.registry.all()))
        await asyncio.sleep(router.args.health_check_interval_s)


async def eviction_loop(router: Router) -> None:
    while True:
        await asyncio.sleep(router.args.eviction_interval_s)
        router.policy.evict()
