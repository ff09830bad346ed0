"""DashboardProbe: the scheduler's side of GET /dashboard (radixlm/server/dashboard/).

Invariants:
- No cost while nobody watches: steps are recorded only until `WATCH_S` seconds after the
  last `DashboardReq` (the API process polls only while a page is subscribed); otherwise a
  step pays one float comparison.
- Bounded work: a step record is a fixed-size tuple in a ring of `STEP_HISTORY`; a
  snapshot visits at most `max_nodes` radix nodes (breadth first) and `max_reqs` requests,
  and bins the KV pool into `SLOT_BINS` bins in numpy (no torch thread-pool barrier).
- Read only: a snapshot never settles batches, evicts or locks anything.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from radixlm.mem.radix_cache import RadixCache
from radixlm.messages import DashboardReq, DashboardSnapshot

if TYPE_CHECKING:
    from collections.abc import Sequence

    from radixlm.executor.step_timer import StepTimer
    from radixlm.mem.pools import Pools
    from radixlm.scheduler.req import Req
    from radixlm.scheduler.schedule_batch import ScheduleBatch


class _Worker(Protocol):
    timer: "StepTimer"


class Scheduler(Protocol):
    """What the probe reads of the scheduler (scheduler/scheduler.py), named here so that
    the probe does not import the scheduler that holds it."""
    worker: _Worker
    pools: "Pools"
    tree_cache: RadixCache
    waiting: "Sequence[Req]"
    running: "Sequence[Req]"
    num_retractions: int
    page_size: int
    prompt_tokens_total: int
    cached_tokens_total: int
    new_token_ratio: float
    overlap: bool
    max_prefill_tokens: int
    max_running_requests: int
    cache_hit_rate: float

    def held_by_requests(self) -> int: ...

STEP_HISTORY = 400  # steps kept for the timeline
WATCH_S = 5.0  # keep recording this long after the last snapshot request
SLOT_BINS = 256  # the KV pool map's resolution
FIRST_TOKENS = 12  # token ids of a node's edge sent for the hover text

# One step: (wall time, mode, prefill tokens, decode tokens, batch size, sampled, step ms,
# scheduler ms, forward ms, bubble ms, waiting, running, retractions in this step).
STEP_FIELDS = ("t", "mode", "prefill_tokens", "decode_tokens", "batch_size", "sampled",
               "step_ms", "sched_ms", "forward_ms", "bubble_ms", "waiting", "running",
               "retractions")


@dataclass
class DashboardProbe:
    steps: deque[tuple] = field(default_factory=lambda: deque(maxlen=STEP_HISTORY))
    watch_until: float = 0.0
    # The timer's cumulative forward / bubble seconds and retractions at the last record.
    last_forward_s: float = 0.0
    last_bubble_s: float = 0.0
    last_retractions: int = 0
    step_seq: int = 0  # steps recorded since start (the page dedupes by it)
    last_oom: dict[str, Any] | None = None

    @property
    def watching(self) -> bool:
        return time.monotonic() < self.watch_until

    # --- per step (only while watching) --------------------------------------------

    def record_step(self, sched: Scheduler, batch: ScheduleBatch | None, t0: float,
                    sched_s: float) -> None:
        """A step that launched `batch` (steps that launch nothing are not recorded)."""
        if batch is None:
            return
        timer = sched.worker.timer
        fwd, bub = timer.forward_s, timer.bubble_s
        prefill = decode = size = 0
        mode = "idle"
        if batch is not None:
            mode = batch.forward_mode.name.lower()
            size = len(batch.reqs)
            if batch.forward_mode.is_extend():
                prefill = sum(r.extend_input_len for r in batch.extend_reqs)
                decode = batch.num_mixed_decodes
            else:
                decode = size
        # Tokens sampled: one per decode, one per prefill whose prompt is now complete.
        if batch is not None and prefill:
            sampled = decode + sum(r.kv_len >= len(r.input_ids) for r in batch.extend_reqs)
        else:
            sampled = decode
        self.step_seq += 1
        self.steps.append((time.time(), mode, prefill, decode, size, sampled,
                           (time.perf_counter() - t0) * 1e3, sched_s * 1e3,
                           (fwd - self.last_forward_s) * 1e3, (bub - self.last_bubble_s) * 1e3,
                           len(sched.waiting), len(sched.running),
                           sched.num_retractions - self.last_retractions))
        self.last_forward_s, self.last_bubble_s = fwd, bub
        self.last_retractions = sched.num_retractions

    def note_oom(self, message: str, phase: str | None = None, pool: str | None = None,
                 fixes: list[str] | None = None) -> None:
        """An out-of-memory diagnosis (mem/oom.py) to show until the next one."""
        self.last_oom = {"t": time.time(), "message": message, "phase": phase, "pool": pool,
                         "fixes": list(fixes or [])}

    # --- the snapshot --------------------------------------------------------------

    def snapshot(self, sched: Scheduler, msg: DashboardReq) -> DashboardSnapshot:
        started = time.perf_counter()
        if not self.watching:  # a fresh watch: the deltas start here
            timer = sched.worker.timer
            self.last_forward_s, self.last_bubble_s = timer.forward_s, timer.bubble_s
            self.last_retractions = sched.num_retractions
        self.watch_until = time.monotonic() + WATCH_S
        pools = sched.pools
        total = pools.allocator.size
        cache = sched.tree_cache
        reqs = self._requests(sched, msg.max_reqs, total)
        data: dict[str, Any] = {
            "pool": {"total_kv_slots": total,
                     "free_kv_slots": pools.allocator.available_size(),
                     "held_by_requests": sched.held_by_requests(),
                     "held_by_cache": cache.total_size(),
                     "evictable": cache.evictable_size(),
                     "protected": cache.protected_size(),
                     "page_size": sched.page_size,
                     "req_rows": pools.req_to_token_pool.size,
                     "free_req_rows": pools.req_to_token_pool.available_size()},
            "slot_map": self._slot_map(sched, total),
            "cache": {"prompt_tokens_total": sched.prompt_tokens_total,
                      "cached_tokens_total": sched.cached_tokens_total,
                      "cache_hit_rate": sched.cache_hit_rate,
                      "evicted_tokens_total": cache.evicted_tokens_total,
                      "disabled": cache.disable},
            "tree": self._tree(cache, msg.max_nodes),
            "requests": reqs,
            "num_running": len(sched.running), "num_waiting": len(sched.waiting),
            "num_retractions": sched.num_retractions,
            "new_token_ratio": sched.new_token_ratio,
            "max_prefill_tokens": sched.max_prefill_tokens,
            "max_running_requests": sched.max_running_requests,
            "step_timing": sched.worker.timer.as_dict(),
            "overlap": sched.overlap,
            "step_fields": STEP_FIELDS,
            "step_seq": self.step_seq,
            "steps": self._steps_since(msg.since_seq),
            "oom": self.last_oom,
        }
        data["build_ms"] = (time.perf_counter() - started) * 1e3
        return DashboardSnapshot(msg.rid, data)

    def _steps_since(self, seq: int) -> list[tuple]:
        new = min(len(self.steps), max(0, self.step_seq - seq))
        return [self.steps[i] for i in range(len(self.steps) - new, len(self.steps))]

    def _requests(self, sched: Scheduler, max_reqs: int, total: int) -> list[dict[str, Any]]:
        now = time.monotonic()
        chosen: list[tuple[str, Req]] = [("running", r) for r in sched.running[:max_reqs]]
        for r in list(sched.waiting)[:max(0, max_reqs - len(chosen))]:
            chosen.append(("prefilling" if r.req_pool_idx is not None else "waiting", r))
        bins = self._request_bins([r for _, r in chosen], sched, total)
        return [{"rid": r.rid, "state": "finished" if r.finished else state,
                 "prompt_tokens": len(r.input_ids), "cached_tokens": r.cached_tokens,
                 "generated_tokens": len(r.output_ids),
                 "max_new_tokens": r.sampling_params.max_new_tokens, "kv_len": r.kv_len,
                 "kv_slots_held": RadixCache.held_by_request(r, sched.page_size),
                 "retractions": r.retractions, "age_s": now - r.arrival_time,
                 "slot_bins": bins[i]} for i, (state, r) in enumerate(chosen)]

    @staticmethod
    def _rows(sched: Scheduler, reqs: list[Req]) -> dict[int, np.ndarray]:
        """The req_to_token rows of `reqs` as numpy arrays (views on the CPU; one gather and
        one copy on a device). Binning runs in numpy: single-threaded, so it never waits at
        a torch thread-pool barrier on a busy CPU."""
        table = sched.pools.req_to_token_pool.req_to_token
        idx = sorted({r.req_pool_idx for r in reqs if r.req_pool_idx is not None})
        if not idx:
            return {}
        if table.device.type == "cpu":
            host = table.numpy()
            return {i: host[i] for i in idx}
        picked = table[torch.tensor(idx, device=table.device)].cpu().numpy()
        return {i: picked[k] for k, i in enumerate(idx)}

    def _request_bins(self, reqs: list[Req], sched: Scheduler, total: int) -> list[list[int]]:
        """The slot-map bins each request's KV positions [0, kv_len) fall in."""
        rows = self._rows(sched, reqs)
        return [np.unique(rows[r.req_pool_idx][:r.kv_len].astype(np.int64) * SLOT_BINS
                          // (total + 1)).tolist()
                if r.req_pool_idx is not None and r.kv_len > 0 else [] for r in reqs]

    def _slot_map(self, sched: Scheduler, total: int) -> dict[str, Any]:
        """Per bin of the slot index space [0, total]: free slots and slots held by requests
        (the rest of a bin is the cache's)."""
        span = total + 1  # slot indices run 1..total (slot 0 is the padding slot)
        alloc = sched.pools.allocator
        pages = alloc.free_pages.cpu().numpy().astype(np.int64)
        ps = alloc.page_size
        free_slots = pages + 1 if ps == 1 else np.add.outer(pages * ps + 1, np.arange(ps)).ravel()
        free = np.bincount(free_slots * SLOT_BINS // span, minlength=SLOT_BINS)
        reqs = [r for r in [*sched.running, *sched.waiting]
                if r.req_pool_idx is not None and r.kv_len > r.cached_len]
        rows = self._rows(sched, reqs)
        held = np.zeros(SLOT_BINS, dtype=np.int64)
        if reqs:
            own = np.concatenate([rows[r.req_pool_idx][r.cached_len:r.kv_len] for r in reqs])
            held = np.bincount(own.astype(np.int64) * SLOT_BINS // span, minlength=SLOT_BINS)
        return {"bins": SLOT_BINS, "span": span, "free": free.tolist(), "requests": held.tolist()}

    @staticmethod
    def _tree(cache: RadixCache, max_nodes: int) -> dict[str, Any]:
        """The first `max_nodes` nodes breadth first (the root is node 0), each with its
        edge length, locks, last access tick and first token ids; `hidden` counts children
        left out."""
        nodes: list[dict[str, Any]] = []
        if cache.disable:
            return {"nodes": nodes, "truncated": False, "clock": 0}
        queue = deque([cache.root])
        truncated = False
        while queue:
            node = queue.popleft()
            if len(nodes) >= max_nodes:
                truncated = True
                break
            kids = list(node.children.values())
            room = max_nodes - len(nodes) - len(queue) - 1
            shown = kids[:max(0, room)]
            queue.extend(shown)
            nodes.append({"id": node.id,
                          "parent": None if node.parent is None else node.parent.id,
                          "tokens": len(node.key), "lock_ref": node.lock_ref,
                          "last_access": node.last_access_time,
                          "first_ids": node.key[:FIRST_TOKENS],
                          "hidden": len(kids) - len(shown)})
        return {"nodes": nodes, "truncated": truncated, "clock": cache._clock}
