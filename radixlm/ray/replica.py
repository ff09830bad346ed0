"""`EngineReplica`: the Ray Serve replica that owns one radixlm engine (child_server.py).

`forward(RoutedRequest)` is an async generator: first `{"status", "headers"}` (with the
replica's id in `x-radixlm-replica`), then the
engine's response body in chunks as they come (server-sent events pass through as they
are written). Cancelling the generator (the client went away) closes the engine
connection, and the engine aborts the request and frees its KV.

`record_routing_stats()` (Serve polls it; request_router.py reads it) reports the engine's
queue (`waiting`), `running`, `kv_usage` (KV slots in use / all, a ratio), and what the
cache-aware policy needs of the engine's cache: `cached_tokens` (0 after a flush or full
eviction: the policy's tree for it is stale) and `engine_id` (new when the engine is new).
With `tp_nodes` > 1 the other TP nodes' ranks run in `TPNodeRank` actors of the replica's
placement group (tp_placement.py). `check_health` fails once the engine process is gone.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, AsyncIterator

import httpx
import ray
from ray import serve

from radixlm.config import ServerArgs
from radixlm.ray import engine_directory
from radixlm.ray.child_server import ChildServer
from radixlm.ray.routed_request import REPLICA_HEADER, RETURNED_HEADERS, RoutedRequest

logger = logging.getLogger(__name__)


class EngineReplica:
    def __init__(self, server_args: ServerArgs, engine_log_dir: str | None = None) -> None:
        ctx = serve.get_replica_context()
        self.app_name = ctx.app_name
        self.replica_id = ctx.replica_id.unique_id
        self.engine_id = uuid.uuid4().hex[:12]
        host = ray.util.get_node_ip_address()
        log = f"{engine_log_dir}/engine-{self.replica_id}.log" if engine_log_dir else None
        self._tp_ranks: list[Any] = []
        if server_args.nnodes > 1:
            from radixlm.ray.tp_placement import start_tp_nodes

            server_args, self._tp_ranks = start_tp_nodes(server_args, host)
        self.engine = ChildServer(server_args, host=host, log_path=log)
        self.engine.wait_healthy()
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0),
                                         limits=httpx.Limits(max_connections=None))
        engine_directory.register(self.app_name, self.replica_id, self.engine.url)
        logger.info("replica %s: engine %s at %s", self.replica_id, self.engine_id,
                    self.engine.url)

    async def forward(self, req: RoutedRequest) -> AsyncIterator[Any]:
        async with self._client.stream(req.method, self.engine.url + req.path,
                                       content=req.body or None,
                                       headers=req.headers) as r:
            headers = {k: r.headers[k] for k in RETURNED_HEADERS if k in r.headers}
            yield {"status": r.status_code, "headers": headers | {REPLICA_HEADER: self.replica_id}}
            async for chunk in r.aiter_raw():
                yield chunk

    async def record_routing_stats(self) -> dict[str, Any]:
        r = await self._client.get(self.engine.url + "/server_info", timeout=5.0)
        pool = r.json()["pool"]
        total = pool["total_kv_slots"] or 1
        return {"engine_id": self.engine_id, "engine_url": self.engine.url,
                "waiting": pool["waiting"], "running": pool["running"],
                "kv_usage": (total - pool["free_kv_slots"]) / total,
                "cached_tokens": pool["held_by_cache"],
                "cache_hit_rate": pool["cache_hit_rate"]}

    def check_health(self) -> None:
        if not self.engine.alive():
            raise RuntimeError(f"engine exited (code {self.engine.proc.returncode})")

    def __del__(self) -> None:
        if not hasattr(self, "engine"):
            return  # the constructor failed before the engine started
        try:
            engine_directory.forget(self.app_name, self.replica_id)
        except Exception:  # the cluster may be going down
            pass
        self.engine.stop()
        for actor in self._tp_ranks:
            ray.kill(actor)
