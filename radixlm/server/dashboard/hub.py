"""DashboardHub: the server's dashboard updates (a Broadcast, broadcast.py).

Invariants:
- Polls the scheduler (a DashboardReq) only while a page is subscribed, so the scheduler
  records no steps and builds no snapshot when nobody watches.
- Steps are sent as deltas (`since_seq`); a new subscriber first gets the hub's history.
- Streams end when the server exits (`tm.exiting`) or has drained (draining, nothing in
  flight).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from typing import Any

from radixlm.config import ServerArgs
from radixlm.server.dashboard.broadcast import Broadcast

STEP_HISTORY = 400  # steps the timeline shows
MAX_NODES = 200
MAX_REQS = 64
TEXT_CACHE = 4096  # decoded node texts kept (by their first token ids)

# The flags that size the pools, shown beside the memory bar.
SIZING_FLAGS = ("mem_fraction_static", "max_total_tokens", "max_running_requests",
                "chunked_prefill_size", "max_prefill_tokens", "page_size", "context_length",
                "kv_cache_dtype", "dtype", "disable_radix_cache", "enable_mixed_chunk",
                "schedule_policy")


class DashboardHub(Broadcast):
    interval_s = 0.5  # 2 updates a second (4 cost 3-5% of throughput on 2 cores, quiet)

    def __init__(self, tm: Any, args: ServerArgs, model_name: str) -> None:
        super().__init__()
        self.tm = tm  # the TokenizerManager
        self.args = args
        self.model_name = model_name
        self.steps: deque[list[Any]] = deque(maxlen=STEP_HISTORY)
        self.step_seq = 0
        self.updates = 0
        self.last: dict[str, Any] | None = None
        self._texts: OrderedDict[tuple[int, ...], str] = OrderedDict()

    def ended(self) -> bool:
        tm = self.tm
        return bool(getattr(tm, "exiting", False)) or (tm.admission.draining
                                                       and tm.num_running == 0)

    def first_update(self) -> dict[str, Any] | None:
        if self.last is None:
            return None
        return {**self.last, "steps": list(self.steps), "history": True}

    async def update(self) -> dict[str, Any]:
        """One update: the scheduler's snapshot (new steps only) and the API side's state."""
        tm = self.tm
        t0 = time.perf_counter()
        try:
            snap = (await tm.dashboard_snapshot(max_nodes=MAX_NODES, max_reqs=MAX_REQS,
                                                since_seq=self.step_seq)).data
            error = None
        except TimeoutError:
            snap, error = None, "the scheduler did not answer within 5 s"
        rtt_ms = (time.perf_counter() - t0) * 1e3
        new_steps: list[list[Any]] = []
        if snap is not None:
            new_steps = [list(s) for s in snap.pop("steps")]
            self.step_seq = snap["step_seq"]
            self.steps.extend(new_steps)
            self._label_nodes(snap["tree"]["nodes"])
        self.updates += 1
        update = {
            "t": time.time(), "seq": self.updates, "model": self.model_name,
            "server": {"draining": tm.admission.draining, "healthy": tm.is_healthy(),
                       "in_flight": tm.num_running,
                       "max_running": tm.admission.max_running,
                       "max_queued": tm.admission.max_queued,
                       "requests_finished_total": tm.requests_finished_total,
                       "generation_tokens_total": tm.generation_tokens_total,
                       "context_len": tm.context_len},
            "memory": self._memory(),
            "latency": tm.latency.summary(),
            "sched": snap, "error": error, "rtt_ms": rtt_ms,
        }
        self.last = update
        return {**update, "steps": new_steps}

    def _memory(self) -> dict[str, Any]:
        plan = self.tm.memory_plan
        flags = {k: getattr(self.args, k) for k in SIZING_FLAGS if hasattr(self.args, k)}
        if plan is None:
            return {"plan": None, "flags": flags}
        return {"flags": flags, "plan": {
            "device_kind": plan.device_kind, "device_total": plan.device_total,
            "device_source": plan.device_source, "weight_bytes": plan.weight_bytes,
            "kv_bytes": plan.kv_tokens * plan.kv_bytes_per_token,
            "kv_bytes_per_token": plan.kv_bytes_per_token, "kv_tokens": plan.kv_tokens,
            "kv_limited_by": plan.kv_limited_by, "req_to_token_bytes": plan.req_to_token_bytes,
            "activation_bytes": plan.activation_headroom,
            "prefill_peak": plan.prefill_peak, "decode_peak": plan.decode_peak,
            "mem_fraction_static": plan.mem_fraction_static,
            "mem_fraction_rule": plan.mem_fraction_rule,
            "max_running_requests": plan.max_running_requests,
            "max_running_rule": plan.max_running_rule,
            "problems": [{"pool": p.pool, "phase": p.phase, "fatal": p.fatal,
                          "message": p.message, "fixes": p.fixes} for p in plan.problems]}}

    def _label_nodes(self, nodes: list[dict[str, Any]]) -> None:
        """Replace each node's first token ids by their text (decoded once, then cached)."""
        for node in nodes:
            ids = tuple(node.pop("first_ids"))
            text = self._texts.get(ids)
            if text is None:
                text = self.tm.tokenizer.decode(list(ids)) if ids else ""
                self._texts[ids] = text
                if len(self._texts) > TEXT_CACHE:
                    self._texts.popitem(last=False)
            else:
                self._texts.move_to_end(ids)
            node["text"] = text
