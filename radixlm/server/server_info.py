"""GET /get_server_info: the server args, the memory plan and the live pool state."""

from __future__ import annotations

import dataclasses
from typing import Any

from radixlm.config import ServerArgs
from radixlm.messages import PoolStats

# Fields of ServerArgs never echoed back.
_SECRET_ARGS = ("api_key",)


def public_server_args(args: ServerArgs) -> dict[str, Any]:
    d = dataclasses.asdict(args)
    for name in _SECRET_ARGS:
        if d.get(name) is not None:
            d[name] = "<redacted>"
    return d


def get_server_info_body(args: ServerArgs, model_name: str, context_len: int,
                         max_running_requests: int | None, memory_plan: Any,
                         pool: PoolStats,
                         cuda_graph_batch_sizes: list[int] | None = None,
                         dtype: dict[str, Any] | None = None,
                         threads: dict[str, int | None] | None = None) -> dict[str, Any]:
    """`memory_plan` is a radixlm.planning.planner.MemoryPlan (None when the engine has none):
    the three pools, the flags it was made with and its problems. `cuda_graph_batch_sizes`:
    the decode batch sizes captured as CUDA graphs (None: graphs off). `dtype`: --dtype as
    given, the dtype it resolved to and why; `threads`: torch's intra-op thread count by
    process ("scheduler", "api")."""
    return {
        "model": model_name,
        "context_len": context_len,
        "max_running_requests": max_running_requests,
        "max_total_tokens": pool.total_kv_slots,
        "server_args": public_server_args(args),
        "memory_plan": None if memory_plan is None else memory_plan.to_dict(),
        "cuda_graph_batch_sizes": cuda_graph_batch_sizes,
        "dtype": dtype,
        "threads": threads,
        "pool": dataclasses.asdict(pool),
    }
