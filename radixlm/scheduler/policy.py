"""SchedulePolicy: the order in which waiting requests are considered for admission,
and the in-batch prefix sharing rule of one admission round.

Policies (chosen by name with `--schedule-policy`, see `make_policy`):
  * `fcfs`: arrival order (retracted requests and a chunked prefill in progress sit at the
    head of the queue, where the scheduler puts them).
  * `lpm`: longest prefix match. The waiting queue is stably sorted by the length of each
    request's longest cached prefix (`RadixCache.match_prefix(fill_ids[:seq_len - 1])`),
    longest first, so requests that reuse the most KV go first while it is still cached.
    A request already holding a req_to_token row (a chunked prefill in progress) always
    stays first. With more than `LPM_MAX_QUEUE_LEN` waiting requests the matching costs
    more than it gains and the order is left as is (FCFS), as in SGLang. With the radix
    cache disabled every prefix is empty, so LPM is FCFS.

More: docs/scheduler.md, "scheduler/policy.py".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from typing import ClassVar

import numpy as np

from radixlm.mem.radix_cache import RadixCache
from radixlm.scheduler.req import Req

# LPM falls back to FCFS when more requests than this are waiting (SGLang uses 128):
# matching every waiting request each step is O(queue * prompt length).
LPM_MAX_QUEUE_LEN = 128

# Defer a candidate when at least this many of its uncached tokens are computed by a
# request admitted earlier in the same round (SGLang's in-batch prefix threshold is 32).
# Below it, the saving does not pay for a step of extra latency.
IN_BATCH_PREFIX_MIN = 32


class SchedulePolicy(ABC):
    """Orders the waiting queue before each admission round."""

    name: ClassVar[str]

    @abstractmethod
    def calc_priority(self, waiting: deque[Req], tree_cache: RadixCache) -> None:
        """Reorder `waiting` in place (the scheduler admits from its head).

        Mutates only the order of `waiting`; implementations that look prefixes up in
        `tree_cache` leave it as any `match_prefix` does (nodes may be split, access times
        refreshed) and take no locks. Requests holding a req_to_token row must stay first.
        """


POLICIES: dict[str, type[SchedulePolicy]] = {}


def register_policy(cls: type[SchedulePolicy]) -> type[SchedulePolicy]:
    POLICIES[cls.name] = cls
    return cls


def make_policy(name: str) -> SchedulePolicy:
    """The policy registered under `name`; ValueError for an unknown name."""
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown schedule policy {name!r}; choose one of "
                         f"{', '.join(sorted(POLICIES))}") from None


@register_policy
class FCFS(SchedulePolicy):
    name = "fcfs"

    def calc_priority(self, waiting: deque[Req], tree_cache: RadixCache) -> None:
        return  # arrival order


@register_policy
class LPM(SchedulePolicy):
    name = "lpm"

    def calc_priority(self, waiting: deque[Req], tree_cache: RadixCache) -> None:
        if tree_cache.disable or len(waiting) <= 1 or len(waiting) > LPM_MAX_QUEUE_LEN:
            return  # nothing to gain, or too long to match: FCFS

        def key(req: Req) -> tuple[int, int]:
            if req.req_pool_idx is not None:  # chunked prefill in progress: stays first
                return (0, 0)
            match = tree_cache.match_prefix(req.fill_ids[:req.seq_len - 1])
            return (1, -match.prefix_len)

        ordered = sorted(waiting, key=key)  # stable: ties keep arrival order
        waiting.clear()
        waiting.extend(ordered)


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two 1-D int arrays (vectorized)."""
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class InBatchPrefixSharing:
    """One admission round's record of the tokens its admitted requests will have in KV.

    After this round's extend, request `r` has K/V (and, through the scheduler's
    `cache_unfinished_req`, radix cache entries) for `fill_ids[:r.kv_len + r.extend_input_len]`.
    A candidate whose cached prefix is `prefix_len` tokens would then match
    `min(common prefix with r, that end)` tokens instead: if that gains at least
    `IN_BATCH_PREFIX_MIN` tokens for some admitted `r`, it should wait one round.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._admitted: list[np.ndarray] = []  # fill_ids[:end] of each admitted request

    def record(self, req: Req) -> None:
        """`req` was admitted this round with `req.extend_input_len` set."""
        if self.enabled:
            end = req.kv_len + req.extend_input_len
            self._admitted.append(np.asarray(req.fill_ids[:end], dtype=np.int64))

    def should_defer(self, req: Req, prefix_len: int) -> bool:
        """Whether `req`, with `prefix_len` tokens cached now, should wait for a request
        admitted earlier in this round to compute a shared prefix. Never for a request
        holding a row (a chunked prefill continues where it is)."""
        if not self._admitted or req.req_pool_idx is not None:
            return False
        key_len = req.seq_len - 1  # what admission matches: the last token is recomputed
        if key_len - prefix_len < IN_BATCH_PREFIX_MIN:
            return False
        cand: np.ndarray | None = None
        for tokens in self._admitted:
            if tokens.size - prefix_len < IN_BATCH_PREFIX_MIN:
                continue  # computes too little beyond what the candidate has cached
            if cand is None:
                cand = np.asarray(req.fill_ids[:key_len], dtype=np.int64)
            if common_prefix_len(cand, tokens) - prefix_len >= IN_BATCH_PREFIX_MIN:
                return True
        return False
