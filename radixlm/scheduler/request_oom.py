"""A request whose forward ran out of memory even alone: it fails, the others go on.

More: docs/scheduler.md, "scheduler/request_oom.py".
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

from radixlm.scheduler.queues import Queues
from radixlm.scheduler.req import Req
from radixlm.scheduler.request_kv import RequestKV

if TYPE_CHECKING:
    from radixlm.scheduler.schedule_batch import ScheduleBatch

logger = logging.getLogger(__name__)

OOM_STATUS = 507


def fail_oom_requests(batch: "ScheduleBatch", failed: dict[int, str], kv: RequestKV,
                      queues: Queues, answer: Callable[[Req], None],
                      note: Callable[[str], None] = lambda message: None) -> None:
    """End the requests of `batch` at the indices in `failed` with their diagnosis;
    `answer` sends a request's last output; `note` shows the diagnosis (the dashboard)."""
    fb = batch.forward_batch
    for i, message in failed.items():
        req = batch.reqs[i]
        computed = fb.extend_seq_lens_cpu[i] if fb.extend_seq_lens_cpu is not None else 1
        kv.poison(req, fb.seq_lens_cpu[i] - computed)  # from the first position it wrote
        logger.error("request %s failed: its forward ran out of memory alone", req.rid)
        note(message)
        waiting = next((k for k, r in enumerate(queues.waiting) if r is req), None)
        if waiting is not None:  # a chunked prefill between chunks
            del queues.waiting[waiting]
            req.finish("abort", error=message, error_status=OOM_STATUS)
            answer(req)
            queues.finishing.append(req)
        else:  # running: answered and released when the scheduler retires finished ones
            req.finish("abort", error=message, error_status=OOM_STATUS)
