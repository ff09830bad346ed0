"""A request whose forward ran out of memory even alone: it fails, the others go on.

The forward worker splits a batch that runs out of memory into halves, recursively
(`executor/forward_worker.py`); a single request that still does not fit comes back in
`SampleOutput.failed` with the memory diagnosis (which pool, which phase, which flag in
which direction, `mem/oom.py`). Here, when its batch is processed:

  * the request ends with finish reason "abort", the diagnosis as its error and HTTP
    status 507 (Insufficient Storage: the server lacks the memory for this request);
  * the K/V of the positions that batch computed for it is garbage (the forward stopped
    part-way), so it must never be reused: `kv_poisoned_from` marks the first such
    position, and when the request is released (`release`, once no launched batch reads
    its row) its KV goes to the radix cache as usual and then every unlocked cache leaf
    of its path from that position on is dropped (`RadixCache.discard_from`).
The pool invariant holds throughout: dropped leaves give their slots to the allocator.

Known limit (overlap only): a request admitted in the very next batch, while this one
ran, may have matched the garbage prefix (it was cached at launch) and locked it; its
output is then computed from that garbage. Nothing leaks either way.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from radixlm.scheduler.req import Req

if TYPE_CHECKING:
    from radixlm.scheduler.schedule_batch import ScheduleBatch
    from radixlm.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)

OOM_STATUS = 507


def fail_oom_requests(sched: "Scheduler", batch: "ScheduleBatch", failed: dict[int, str]) -> None:
    """End the requests of `batch` at the indices in `failed` with their diagnosis."""
    fb = batch.forward_batch
    for i, message in failed.items():
        req = batch.reqs[i]
        computed = fb.extend_seq_lens_cpu[i] if fb.extend_seq_lens_cpu is not None else 1
        start = fb.seq_lens_cpu[i] - computed  # first position this forward wrote
        req.kv_poisoned_from = (start if req.kv_poisoned_from is None
                                else min(start, req.kv_poisoned_from))
        logger.error("request %s failed: its forward ran out of memory alone", req.rid)
        sched.dashboard.note_oom(message)
        waiting = next((k for k, r in enumerate(sched.waiting) if r is req), None)
        if waiting is not None:  # a chunked prefill between chunks
            del sched.waiting[waiting]
            req.finish("abort", error=message, error_status=OOM_STATUS)
            sched.outbox.append(sched.output_processor.make_output(req))
            sched.finishing.append(req)
        else:  # running: answered and released when the scheduler retires finished ones
            req.finish("abort", error=message, error_status=OOM_STATUS)


def release(sched: "Scheduler", req: Req) -> None:
    """Hand a finished request's KV to the cache; drop what a failed forward wrote.

    A failed request owns positions [cached_len, kv_len) (its last page whole); kv_len may
    even exceed its seq_len (overlap: a later batch wrote the K/V of a token that was then
    discarded). Its own pages from the poisoned position on (rounded down to a page, not
    below cached_len) are freed, the rest goes to the cache, and then the cache's garbage
    part of its path (inserted at launch) is dropped."""
    poisoned = req.kv_poisoned_from
    if poisoned is None or req.req_pool_idx is None:
        sched.tree_cache.cache_finished_req(req)
        return
    key = req.fill_ids[:min(req.kv_len, req.seq_len)]
    page = sched.page_size
    keep = max(req.cached_len, min(poisoned, req.seq_len, req.kv_len) // page * page)
    if req.kv_len > keep:
        # `keep` is page-aligned: the slice starts at a page's first slot, so whole pages.
        row = sched.runner.req_to_token_pool.req_to_token[req.req_pool_idx, keep:req.kv_len]
        sched.runner.allocator.free(row.to(torch.int64))
        req.kv_len = keep
    sched.tree_cache.cache_finished_req(req)
    dropped = sched.tree_cache.discard_from(key, poisoned)
    logger.info("request %s: dropped %d cached tokens its failed forward wrote", req.rid, dropped)
