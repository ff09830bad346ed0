"""Cached K/V that admission must not match yet: written by a forward not known to succeed.

An extend's prompt K/V enters the radix cache at launch (`Scheduler._launch`), before its
forward ran. Under overlap the next admission round runs while that forward is on the
forward thread; if it then fails (a lone request out of memory, `request_oom.py`), the
slots hold garbage until the failed request is released and its path discarded.
Invariant: a new request never locks a cached prefix containing
  * a slot the launched, unprocessed batch writes (`out_cache_loc` of `sched.inflight`), or
  * a slot a failed, not yet released request wrote (its row from `kv_poisoned_from` on).
Such a request is deferred (it keeps its place in the queue) and matched again next
round: by then the forward is processed and, if it failed, its path is discarded once
released. The serial loop never has either kind at admission time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixlm.scheduler.scheduler import Scheduler


def unsettled_slots(sched: "Scheduler") -> torch.Tensor | None:
    """The KV slots a match must not contain now; None when there are none."""
    parts = []
    if sched.inflight is not None:
        parts.append(sched.inflight.batch.forward_batch.out_cache_loc)
    table = sched.runner.req_to_token_pool.req_to_token
    for req in sched.finishing:  # a failed request waits here until no batch reads it
        if req.kv_poisoned_from is not None and req.req_pool_idx is not None:
            parts.append(table[req.req_pool_idx, req.kv_poisoned_from:req.kv_len])
    parts = [p for p in parts if p.numel()]
    if not parts:
        return None
    return torch.cat([p.to(torch.int64) for p in parts])


def reads_unsettled(match_slots: torch.Tensor, unsettled: torch.Tensor | None) -> bool:
    """Whether the matched prefix's slots include an unsettled one."""
    if unsettled is None or match_slots.numel() == 0:
        return False
    return bool(torch.isin(match_slots.to(unsettled.device), unsettled).any())
