"""RequestKV: the one owner of requests' KV rows and pages on the scheduler side.

A request's row of req_to_token holds positions [0, cached_len) from the radix cache
(locked through `req.last_node`) and [cached_len, kv_len) of its own, its partly filled
last page whole. Every change of that ownership goes through here: admit (row + cached
prefix), commit (prompt KV to the cache at launch), retract (KV to the cache, row freed),
undo a prepared step (`unprepare`), poison after a failed forward, release. A batch's new
slots are allocated per batch by ScheduleBatch.prepare_for_extend/decode over the same
pools. Invariant: free + held by the cache + held by requests == total slots, and every
used row belongs to one live request (`check`). See docs/memory.md, "Who owns a KV slot".
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Iterable

import torch

from radixlm.mem import KVSlotAllocator, PoolInvariantError, ReqToTokenPool, check_pool_invariant
from radixlm.mem.radix_cache import RadixCache
from radixlm.scheduler.req import Req

if TYPE_CHECKING:
    from radixlm.mem.radix_tree_node import MatchResult
    from radixlm.scheduler.schedule_batch import ScheduleBatch

logger = logging.getLogger(__name__)


class RequestKV:
    def __init__(self, req_to_token_pool: ReqToTokenPool, allocator: KVSlotAllocator,
                 tree_cache: RadixCache) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.tree_cache = tree_cache
        self.page_size = allocator.page_size

    # --- page arithmetic ------------------------------------------------------------

    def page_floor(self, n: int) -> int:
        """n rounded down to a whole number of pages (in slots)."""
        return n // self.page_size * self.page_size

    def page_ceil(self, n: int) -> int:
        """n rounded up to a whole number of pages (in slots)."""
        return -(-n // self.page_size) * self.page_size

    # --- ownership changes ----------------------------------------------------------

    def admit(self, req: Req, match: "MatchResult", locked: bool) -> None:
        """Give an admitted request a row whose first prefix_len positions are the cache's
        slots of its matched prefix (locked by the caller when `locked`)."""
        pool = self.req_to_token_pool
        req.req_pool_idx = pool.alloc()
        assert req.req_pool_idx is not None, "PrefillAdder checks free req_to_token rows"
        pool.write(req.req_pool_idx, 0, match.device_indices)
        req.last_node = match.last_node if locked else None
        req.cached_len = match.prefix_len

    def commit(self, req: Req) -> None:
        """Its computed prompt KV goes into the radix cache; it keeps running (at launch)."""
        self.tree_cache.cache_unfinished_req(req)

    def hand_back(self, req: Req) -> None:
        """Its valid KV to the cache, its row and lock freed; it holds nothing afterwards."""
        self.tree_cache.cache_finished_req(req)

    def retract(self, req: Req) -> None:
        """Back to the queue: `hand_back`, counted (a cache hit on readmission)."""
        self.hand_back(req)
        req.retractions += 1

    def unprepare(self, batch: "ScheduleBatch") -> None:
        """Free the fresh pages `prepare_for_extend/decode` took for a batch not launched.
        Request b computed positions [kv_len, kv_len + n_b); those from its first page
        boundary at or after kv_len on lie in fresh pages, whose first slots are among them
        (`allocator.free` frees a page by its first slot)."""
        fb = batch.forward_batch
        table = self.req_to_token_pool.req_to_token
        lens = fb.extend_seq_lens_cpu if fb.extend_seq_lens_cpu is not None else [1] * fb.batch_size
        for req, n in zip(batch.reqs, lens):
            start = self.page_ceil(req.kv_len)
            end = req.kv_len + n
            if end > start:
                self.allocator.free(table[req.req_pool_idx, start:end].to(torch.int64))

    def roll_back(self, req: Req, start: int) -> None:
        """Positions from `start` on hold stale K/V (a jump-forward changed their ids): free
        the request's own whole pages past the one `start` falls in and set kv_len there
        (not below cached_len). Its row and the rest stay its own; nothing in flight may
        read the row."""
        if req.kv_poisoned_from is not None:
            return  # released through `release`, which drops the poisoned part
        keep = max(req.cached_len, min(start, req.kv_len))
        first_free = self.page_ceil(keep)
        if req.kv_len > first_free:
            row = self.req_to_token_pool.req_to_token[req.req_pool_idx, first_free:req.kv_len]
            self.allocator.free(row.to(torch.int64))
        req.kv_len = keep

    def poison(self, req: Req, start: int) -> None:
        """A forward that wrote positions from `start` on failed: that K/V is garbage and
        must never be reused (dropped at `release`)."""
        req.kv_poisoned_from = (start if req.kv_poisoned_from is None
                                else min(start, req.kv_poisoned_from))

    def release(self, req: Req) -> None:
        """Hand a finished request's KV to the cache; drop what a failed forward wrote.

        A failed request owns positions [cached_len, kv_len) (its last page whole); kv_len may
        even exceed its seq_len (overlap: a later batch wrote the K/V of a token that was then
        discarded). Its own pages from the poisoned position on (rounded down to a page, not
        below cached_len) are freed, the rest goes to the cache, and then the cache's garbage
        part of its path (inserted at launch) is dropped."""
        poisoned = req.kv_poisoned_from
        if poisoned is None and req.req_pool_idx is not None and req.kv_len > req.seq_len:
            # Overlap: a batch launched before it finished computed a position no token
            # was appended for (e.g. max_new_tokens=0 with prompt_logprobs): not cached.
            self.roll_back(req, req.seq_len)
        if poisoned is None or req.req_pool_idx is None:
            self.tree_cache.cache_finished_req(req)
            return
        key = req.fill_ids[:min(req.kv_len, req.seq_len)]
        keep = max(req.cached_len, self.page_floor(min(poisoned, req.seq_len, req.kv_len)))
        if req.kv_len > keep:
            # `keep` is page-aligned: the slice starts at a page's first slot, so whole pages.
            row = self.req_to_token_pool.req_to_token[req.req_pool_idx, keep:req.kv_len]
            self.allocator.free(row.to(torch.int64))
            req.kv_len = keep
        self.tree_cache.cache_finished_req(req)
        dropped = self.tree_cache.discard_from(key, poisoned)
        logger.info("request %s: dropped %d cached tokens its failed forward wrote", req.rid, dropped)

    # --- K/V a forward has not settled yet (overlap) ----------------------------------

    def unsettled_slots(self, inflight_loc: torch.Tensor | None,
                        finishing: Iterable[Req]) -> torch.Tensor | None:
        """Slots a new match must not contain (None: none): those the launched, unprocessed
        batch writes (`inflight_loc`) and a failed, unreleased request's poisoned positions.
        Their prompt K/V entered the cache at launch; under overlap admission runs before
        the forward is known to succeed, so such a match is deferred one round. The serial
        loop never has either kind at admission. docs/scheduler.md, "Failed forwards"."""
        parts = [] if inflight_loc is None else [inflight_loc]
        table = self.req_to_token_pool.req_to_token
        for req in finishing:  # a failed request waits there until no batch reads it
            if req.kv_poisoned_from is not None and req.req_pool_idx is not None:
                parts.append(table[req.req_pool_idx, req.kv_poisoned_from:req.kv_len])
        parts = [p for p in parts if p.numel()]
        return torch.cat([p.to(torch.int64) for p in parts]) if parts else None

    @staticmethod
    def reads_unsettled(match_slots: torch.Tensor, unsettled: torch.Tensor | None) -> bool:
        """Whether a matched prefix's slots include an unsettled one."""
        if unsettled is None or match_slots.numel() == 0:
            return False
        return bool(torch.isin(match_slots.to(unsettled.device), unsettled).any())

    # --- accounting -----------------------------------------------------------------

    def held_by(self, reqs: Iterable[Req]) -> int:
        """KV slots owned by these requests (a partly filled last page counts whole)."""
        return sum(RadixCache.held_by_request(r, self.page_size) for r in reqs)

    def check(self, reqs: list[Req]) -> None:
        """Raise PoolInvariantError if a KV slot or a req_to_token row leaked; `reqs`: every
        request that may hold any (running, waiting, finishing)."""
        check_pool_invariant(self.allocator, self.held_by(reqs), self.tree_cache.total_size())
        pool = self.req_to_token_pool
        rows_used = pool.size - pool.available_size()
        held_rows = sum(r.req_pool_idx is not None for r in reqs)
        if rows_used != held_rows:
            raise PoolInvariantError(f"req_to_token rows leak: {rows_used} used, {held_rows} held")
