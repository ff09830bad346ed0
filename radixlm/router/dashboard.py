"""The router's GET /dashboard: each instance's load, cache hit rate and state, and where the
last requests went and why (radixlm/server/dashboard/ serves the page's files).

Invariants:
- `RoutingLog` keeps the last `LOG_LEN` decisions (one fixed-size record per routed
  request: the worker, the policy's reason, the prefix match ratio, every worker's load
  at that moment); it is written whether or not anyone watches (O(workers) per request).
- The instances' /server_info are polled only while a page is subscribed (Broadcast),
  twice a second, with a 2 s timeout each, concurrently.
- Streams end when the router exits (`RouterServer`), so they never hold up its shutdown.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import httpx
import uvicorn
from fastapi import FastAPI

from radixlm.server.dashboard.broadcast import Broadcast
from radixlm.server.dashboard.routes import install_event_stream, mount_static, page_response

if TYPE_CHECKING:
    from radixlm.router.router import Router

INFO_TIMEOUT_S = 2.0


class RouterDashboardHub(Broadcast):
    interval_s = 0.5

    def __init__(self, router: Router) -> None:
        super().__init__()
        self.router = router
        self.updates = 0

    def ended(self) -> bool:
        return self.router.exiting

    async def _instance(self, url: str) -> dict[str, Any]:
        key = self.router.args.api_key
        try:
            r = await self.router.http().get(
                url + "/server_info", timeout=INFO_TIMEOUT_S,
                headers={"Authorization": f"Bearer {key}"} if key else {})
            if r.status_code != 200:
                return {"error": f"/server_info: HTTP {r.status_code}"}
            pool = r.json().get("pool", {})
            return {"pool": {k: pool.get(k) for k in (
                "total_kv_slots", "free_kv_slots", "held_by_requests", "held_by_cache",
                "running", "waiting", "cache_hit_rate", "prompt_tokens_total",
                "cached_tokens_total")}}
        except (httpx.HTTPError, ValueError) as e:
            return {"error": f"{type(e).__name__}: {e}"}

    async def update(self) -> dict[str, Any]:
        workers = self.router.registry.all()
        infos = await asyncio.gather(*(self._instance(w.url) for w in workers))
        self.updates += 1
        log = self.router.routing_log
        return {"t": time.time(), "seq": self.updates, "policy": self.router.policy.name,
                "exiting": self.router.exiting,
                "workers": [{"url": w.url, "healthy": w.healthy, "load": w.load,
                             "consecutive_failures": w.consecutive_failures, **info}
                            for w, info in zip(workers, infos)],
                "decisions": list(log.entries)[-30:], "routed_total": log.seq}


class RouterServer(uvicorn.Server):
    """uvicorn's Server that ends the dashboard's event streams when told to exit."""

    def __init__(self, config: uvicorn.Config, router: Router) -> None:
        super().__init__(config)
        self.router = router

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.router.exiting = True
        super().handle_exit(sig, frame)


def install_router_dashboard(app: FastAPI, router: Router, check_key: Any) -> RouterDashboardHub:
    hub = RouterDashboardHub(router)

    @app.get("/dashboard", include_in_schema=False)
    async def dashboard() -> Any:
        return page_response("router.html")

    mount_static(app)
    install_event_stream(app, hub.stream, check_key)
    return hub
