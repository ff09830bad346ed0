"""RadixCache: matching, splitting, insertion, locks, LRU eviction, pages, request hooks.

Every test uses the real ReqToTokenPool / KVSlotAllocator and hand-built Req objects, and
checks the pool invariant (free + tree + running requests == total) after each operation.
"""

from __future__ import annotations

import random

import pytest
import torch

from radixlm.mem import KVSlotAllocator, ReqToTokenPool, check_pool_invariant
from radixlm.mem.radix_cache import MatchResult, RadixCache, TreeNode
from radixlm.sampling_params import SamplingParams
from radixlm.scheduler.req import Req


class Harness:
    """Plays the scheduler's part: admits requests, allocates their KV, caches them.

    `slot_info[slot] = (position, token id)` records what each allocated slot holds, so any
    slot list can be checked against the key it claims to cache.
    """

    def __init__(self, size: int = 64, rows: int = 4, ctx: int = 64, page_size: int = 1,
                 disable: bool = False) -> None:
        self.size = size
        self.alloc = KVSlotAllocator(size)
        self.pool = ReqToTokenPool(rows, ctx)
        self.cache = RadixCache(self.pool, self.alloc, page_size=page_size, disable=disable)
        self.running: list[Req] = []
        self.slot_info: dict[int, tuple[int, int]] = {}
        self._n = 0

    # --- scheduler actions

    def req(self, ids: list[int]) -> Req:
        self._n += 1
        return Req(rid=f"r{self._n}", input_ids=list(ids), sampling_params=SamplingParams())

    def admit(self, req: Req, match_len: int | None = None) -> MatchResult:
        """match_prefix + lock + take a row holding the matched prefix."""
        key = req.fill_ids if match_len is None else req.fill_ids[:match_len]
        m = self.cache.match_prefix(key)
        self.check_slots(m.device_indices, key)
        self.cache.inc_lock_ref(m.last_node)
        row = self.pool.alloc()
        assert row is not None
        req.req_pool_idx, req.last_node = row, m.last_node
        req.cached_len = req.kv_len = m.prefix_len
        self.pool.write(row, 0, m.device_indices)
        self.running.append(req)
        return m

    def extend(self, req: Req, upto: int) -> bool:
        """Compute K/V of positions [kv_len, upto): allocate (evicting if needed), record."""
        n = upto - req.kv_len
        slots = self.alloc.alloc(n)
        if slots is None:
            self.cache.evict(n - self.alloc.available_size())
            slots = self.alloc.alloc(n)
            if slots is None:
                return False
        self.pool.write(req.req_pool_idx, req.kv_len, slots)
        fill = req.fill_ids
        for i, s in enumerate(slots.tolist()):
            self.slot_info[s] = (req.kv_len + i, fill[req.kv_len + i])
        req.kv_len = upto
        return True

    def finish(self, req: Req) -> None:
        self.cache.cache_finished_req(req)
        self.running = [r for r in self.running if r is not req]

    def insert_fresh(self, key: list[int]) -> torch.Tensor:
        """Allocate slots for `key`, insert them, free what the tree already had."""
        slots = self.alloc.alloc(len(key))
        for i, s in enumerate(slots.tolist()):
            self.slot_info[s] = (i, key[i])
        prefix = self.cache.insert(key, slots)
        aligned = len(key) - len(key) % self.cache.page_size
        self.alloc.free(torch.cat([slots[:prefix], slots[aligned:]]))  # nothing was matched
        return slots

    # --- checks

    def check_slots(self, slots: torch.Tensor, key: list[int]) -> None:
        for p, s in enumerate(slots.tolist()):
            assert self.slot_info[s] == (p, key[p]), f"slot {s} at position {p}"

    def row(self, req: Req) -> torch.Tensor:
        return self.pool.req_to_token[req.req_pool_idx, :req.kv_len].to(torch.int64)

    def check(self) -> None:
        cache = self.cache
        cache.check_tree()
        cache.check_invariant(self.running)
        check_pool_invariant(self.alloc, sum(map(cache.held_by_request, self.running)),
                             cache.total_size())
        # Partition: free, tree and request-owned slots are disjoint and cover 1..size.
        parts = [self.alloc.free_slots]
        stack: list[tuple[TreeNode, int]] = [(cache.root, 0)]
        while stack:  # every node's slots hold its tokens at their absolute positions
            node, depth = stack.pop()
            for i, s in enumerate(node.value.tolist()):
                assert self.slot_info[s] == (depth + i, node.key[i]), f"tree slot {s}"
            if node is not cache.root:
                parts.append(node.value)
            for child in node.children.values():
                stack.append((child, depth + len(node.key)))
        expected_locks: dict[int, int] = {}
        for r in self.running:
            parts.append(self.row(r)[r.cached_len:])
            self.check_slots(self.row(r), r.fill_ids)
            node = r.last_node
            while node is not None and node is not cache.root:
                expected_locks[node.id] = expected_locks.get(node.id, 0) + 1
                node = node.parent
        allslots = torch.sort(torch.cat(parts)).values
        assert torch.equal(allslots, torch.arange(1, self.size + 1)), "slot owned twice or lost"
        for node in cache._iter_nodes():
            assert node.lock_ref == expected_locks.get(node.id, 0), node


def slots_of(t: torch.Tensor) -> list[int]:
    return t.tolist()


# ---------------------------------------------------------------------------- match / insert

def test_match_on_empty_tree():
    h = Harness()
    m = h.cache.match_prefix([1, 2, 3])
    assert m.prefix_len == 0 and m.last_node is h.cache.root
    assert m.device_indices.dtype == torch.int64
    assert h.cache.match_prefix([]).prefix_len == 0
    assert h.cache.total_size() == 0
    h.check()


def test_insert_then_full_and_partial_match():
    h = Harness()
    v = h.insert_fresh([1, 2, 3, 4, 5])
    assert h.cache.total_size() == 5 and h.cache.evictable_size() == 5
    full = h.cache.match_prefix([1, 2, 3, 4, 5, 6, 7])
    assert slots_of(full.device_indices) == slots_of(v)
    assert full.last_node.key == [1, 2, 3, 4, 5]
    assert h.cache.match_prefix([9, 1]).prefix_len == 0
    part = h.cache.match_prefix([1, 2, 3])
    assert slots_of(part.device_indices) == slots_of(v[:3])
    h.check()


def test_split_inside_node_keeps_both_halves():
    h = Harness()
    v = h.insert_fresh([1, 2, 3, 4, 5])
    m = h.cache.match_prefix([1, 2, 3, 9])
    assert m.prefix_len == 3
    upper = m.last_node
    assert upper.key == [1, 2, 3] and slots_of(upper.value) == slots_of(v[:3])
    (lower,) = upper.children.values()
    assert lower.key == [4, 5] and slots_of(lower.value) == slots_of(v[3:])
    assert lower.parent is upper and upper.parent is h.cache.root
    assert slots_of(h.cache.match_prefix([1, 2, 3, 4, 5]).device_indices) == slots_of(v)
    assert h.cache.match_prefix([1, 2, 3]).last_node is upper  # exact end: no new split
    assert h.cache.total_size() == 5
    h.check()


def test_insert_returns_already_cached_length():
    h = Harness()
    assert h.cache.insert([1, 2, 3], h.alloc.alloc(3)) == 0
    for key, cached in [([1, 2, 3, 4, 5], 3), ([1, 2, 9], 2), ([1, 2], 2), ([7], 0),
                        ([1, 2, 3, 4, 5], 5)]:
        slots = h.alloc.alloc(len(key))
        assert h.cache.insert(key, slots) == cached
        h.alloc.free(slots[:cached])  # the caller frees its duplicates
        check_pool_invariant(h.alloc, 0, h.cache.total_size())
    assert h.cache.total_size() == 7  # 1 2 | 3 4 5 | 9 ; 7
    h.cache.check_tree()


def test_insert_rejects_length_mismatch():
    h = Harness()
    with pytest.raises(ValueError):
        h.cache.insert([1, 2], torch.tensor([5], dtype=torch.int64))


# ---------------------------------------------------------------------------- request hooks

def test_cache_finished_req_frees_duplicates():
    h = Harness()
    h.insert_fresh([1, 2])
    a, b = h.req([1, 2, 3, 4, 5, 6]), h.req([1, 2, 3, 4, 7])
    h.admit(a), h.admit(b)
    assert a.cached_len == b.cached_len == 2
    assert h.extend(a, 6) and h.extend(b, 5)
    h.check()
    b_slots = h.row(b)
    h.finish(a)  # tree had [1, 2] (a's own matched prefix): nothing duplicated
    assert h.cache.total_size() == 6 and h.alloc.available_size() == 64 - 6 - 3
    h.check()
    free_before = h.alloc.available_size()
    h.finish(b)  # tree now has [1, 2, 3, 4]: b's positions 2, 3 are duplicates
    assert h.alloc.available_size() == free_before + 2
    assert set(slots_of(b_slots[2:4])) <= set(slots_of(h.alloc.free_slots))
    assert h.cache.total_size() == 7
    assert slots_of(h.cache.match_prefix([1, 2, 3, 4, 7]).device_indices)[4] == int(b_slots[4])
    assert (b.req_pool_idx, b.kv_len, b.last_node, b.cached_len) == (None, 0, None, 0)
    assert h.pool.available_size() == 4 and h.cache.protected_size() == 0
    h.check()


def test_same_prompt_twice_without_match_frees_whole_copy():
    h = Harness()
    a, b = h.req([5, 6, 7, 8]), h.req([5, 6, 7, 8])
    h.admit(a), h.admit(b)
    h.extend(a, 4), h.extend(b, 4)
    h.finish(a)
    h.finish(b)
    assert h.cache.total_size() == 4 and h.alloc.available_size() == 60
    h.check()


def test_cache_unfinished_req_rewrites_row_and_moves_lock():
    h = Harness()
    other, a = h.req([1, 2, 3, 4, 5, 6]), h.req([1, 2, 3, 4, 5, 6, 7, 8, 9])
    h.admit(other), h.admit(a)
    h.extend(other, 6)
    h.extend(a, 4)  # first chunk of a
    h.finish(other)  # tree: [1..6]
    old_row = h.row(a)
    h.cache.cache_unfinished_req(a)  # a's positions 0..3 duplicate the tree's
    h.check()
    tree_slots = h.cache.match_prefix([1, 2, 3, 4]).device_indices
    assert slots_of(h.row(a)) == slots_of(tree_slots)
    assert set(slots_of(old_row)) <= set(slots_of(h.alloc.free_slots))
    assert a.cached_len == 4 and a.kv_len == 4 and a.req_pool_idx is not None
    assert a.last_node.key == [1, 2, 3, 4] and a.last_node.lock_ref == 1
    assert h.cache.protected_size() == 4 and h.cache.held_by_request(a) == 0
    h.extend(a, 8)  # next chunk; positions 4, 5 duplicate the tree's again
    h.cache.cache_unfinished_req(a)
    h.check()
    assert a.cached_len == 8 and a.last_node.key == [7, 8]
    assert h.cache.protected_size() == 8
    assert h.cache.evict(100) == 0  # everything is on a's locked path
    h.extend(a, 9)
    h.finish(a)
    assert h.cache.protected_size() == 0 and h.cache.total_size() == 9
    h.check()


# ---------------------------------------------------------------------------- locks / eviction

def test_lock_protects_from_eviction_and_unlock_makes_evictable():
    h = Harness()
    h.insert_fresh([1, 2, 3, 4])
    h.insert_fresh([9, 8])
    m = h.cache.match_prefix([1, 2, 3])
    assert h.cache.inc_lock_ref(m.last_node) == -3
    assert (h.cache.evictable_size(), h.cache.protected_size()) == (3, 3)
    assert h.cache.inc_lock_ref(m.last_node) == 0  # already protected
    assert h.cache.evict(100) == 3  # [4] and [9, 8]; [1, 2, 3] is locked
    assert h.cache.match_prefix([1, 2, 3]).prefix_len == 3
    assert h.cache.dec_lock_ref(m.last_node) == 0  # still locked once
    assert h.cache.dec_lock_ref(m.last_node) == 3
    assert (h.cache.evictable_size(), h.cache.protected_size()) == (3, 0)
    assert h.cache.evict(1) == 3
    assert h.cache.total_size() == 0 and h.alloc.available_size() == 64
    with pytest.raises(RuntimeError, match="no longer in the radix tree"):
        h.cache.dec_lock_ref(m.last_node)  # evicted
    with pytest.raises(RuntimeError, match="no longer in the radix tree"):
        h.cache.inc_lock_ref(m.last_node)
    h.insert_fresh([5])
    with pytest.raises(RuntimeError, match="unlocked"):
        h.cache.dec_lock_ref(h.cache.match_prefix([5]).last_node)
    assert h.cache.inc_lock_ref(h.cache.root) == 0 and h.cache.dec_lock_ref(h.cache.root) == 0
    h.check()


def test_lru_eviction_order_and_parents_become_leaves():
    h = Harness()
    h.insert_fresh([1, 2, 3, 4])  # t1
    h.insert_fresh([1, 2, 3, 5])  # t2: splits into [1,2,3] -> {[4] (t1), [5] (t2)}
    h.insert_fresh([7, 8])        # t3
    root = h.cache.root
    assert h.cache.evict(1) == 1 and h.cache.match_prefix([1, 2, 3, 4]).prefix_len == 3
    # ^ that match refreshed [1, 2, 3] (t4), so [5] is now the oldest leaf, then [7, 8]
    assert h.cache.evict(1) == 1 and h.cache.match_prefix([1, 2, 3, 5]).prefix_len == 3
    # [1, 2, 3] is now a leaf (t5); [7, 8] (t3) is older
    assert h.cache.evict(1) == 2 and list(root.children) == [1]
    assert h.cache.evict(1) == 3 and not root.children
    h.check()


def test_evict_cascades_within_one_call():
    h = Harness()
    h.insert_fresh([1, 2, 3, 4])
    h.insert_fresh([1, 2, 3, 5])
    h.insert_fresh([7, 8])  # newest
    assert h.cache.evict(4) == 5  # [4], [5], then parent [1, 2, 3] (t2 < t3)
    assert list(h.cache.root.children) == [7]
    h.check()


def test_evict_more_than_evictable_frees_what_it_can():
    h = Harness()
    h.insert_fresh([1, 2, 3, 4, 5])
    h.insert_fresh([1, 2, 6])
    m = h.cache.match_prefix([1, 2, 6])
    h.cache.inc_lock_ref(m.last_node)
    assert h.cache.evict(1000) == 3  # [3, 4, 5] only
    assert h.cache.total_size() == h.cache.protected_size() == 3
    assert h.cache.evict(1000) == 0 and h.cache.evict(0) == 0
    h.cache.dec_lock_ref(m.last_node)
    check_pool_invariant(h.alloc, 0, h.cache.total_size())


def test_reset_refuses_while_locked_then_frees_everything():
    h = Harness()
    a = h.req([1, 2, 3, 4])
    h.admit(a)
    h.extend(a, 4)
    h.cache.cache_unfinished_req(a)
    h.insert_fresh([5, 6])
    with pytest.raises(RuntimeError, match="locked"):
        h.cache.reset()
    h.check()  # refused reset changed nothing
    h.finish(a)
    stale = h.cache.match_prefix([5, 6]).last_node
    h.cache.reset()
    assert h.cache.total_size() == 0 and h.alloc.available_size() == 64
    assert h.cache.match_prefix([1, 2, 3]).prefix_len == 0
    h.check()
    with pytest.raises(RuntimeError, match="no longer in the radix tree"):
        h.cache.inc_lock_ref(stale)
    h.insert_fresh([1, 2])  # usable again
    assert h.cache.match_prefix([1, 2]).prefix_len == 2


# ---------------------------------------------------------------------------- pages / disable

@pytest.mark.parametrize("page_size", [2, 4])
def test_page_granular_match_and_insert(page_size):
    h = Harness(page_size=page_size)
    key = list(range(1, 11))  # 10 tokens: all cached with page 2, 8 with page 4
    aligned = 10 - 10 % page_size
    slots = h.alloc.alloc(10)
    assert h.cache.insert(key, slots) == 0
    h.alloc.free(slots[aligned:])  # the unaligned tail is the caller's
    assert h.cache.total_size() == aligned
    check_pool_invariant(h.alloc, 0, h.cache.total_size())
    # a query is cut to whole pages
    assert h.cache.match_prefix(key[:page_size + 1]).prefix_len == page_size
    assert h.cache.match_prefix(key[:page_size - 1]).prefix_len == 0
    # a mismatch inside the second page matches only the first page, splitting there
    m = h.cache.match_prefix(key[:page_size + 1] + [99] * page_size)
    assert m.prefix_len == page_size and len(m.last_node.key) == page_size
    assert slots_of(m.device_indices) == slots_of(slots[:page_size])
    assert slots_of(h.cache.match_prefix(key).device_indices) == slots_of(slots[:aligned])
    # same first token, different first page: a separate child of the root
    other = [1] + [50] * (page_size - 1)
    s2 = h.alloc.alloc(page_size)
    assert h.cache.insert(other, s2) == 0
    assert len(h.cache.root.children) == 2
    assert all(isinstance(k, tuple) and len(k) == page_size for k in h.cache.root.children)
    h.cache.check_tree()
    check_pool_invariant(h.alloc, 0, h.cache.total_size())


@pytest.mark.parametrize("page_size", [2, 4])
def test_page_size_request_hooks_free_unaligned_tail(page_size):
    h = Harness(page_size=page_size)
    a = h.req(list(range(1, 8)))  # 7 tokens
    h.admit(a)
    h.extend(a, 7)
    aligned = 7 - 7 % page_size
    h.cache.cache_unfinished_req(a)  # the tail stays the request's
    assert a.cached_len == aligned and h.cache.held_by_request(a) == 7 - aligned
    h.check()
    h.finish(a)  # the tail is freed
    assert h.cache.total_size() == aligned and h.alloc.available_size() == 64 - aligned
    h.check()
    b = h.req(list(range(1, 8)) + [42])
    m = h.admit(b)
    assert m.prefix_len == aligned
    h.extend(b, 8)
    h.finish(b)
    assert h.cache.total_size() == 8
    h.check()


def test_disabled_cache_caches_nothing():
    h = Harness(disable=True)
    a = h.req([1, 2, 3, 4])
    m = h.admit(a)
    assert m.prefix_len == 0 and m.last_node is h.cache.root
    h.extend(a, 3)
    before = h.row(a)
    h.cache.cache_unfinished_req(a)  # no-op
    assert slots_of(h.row(a)) == slots_of(before) and a.cached_len == 0
    h.check()
    assert h.cache.insert([1, 2], torch.tensor([1, 2])) == 0
    h.finish(a)
    assert h.cache.total_size() == 0 and h.alloc.available_size() == 64
    assert h.pool.available_size() == 4 and h.cache.evict(10) == 0
    assert h.cache.match_prefix([1, 2, 3]).prefix_len == 0
    h.cache.reset()
    h.check()


def test_repr_and_pretty_print():
    h = Harness()
    h.insert_fresh([1, 2, 3])
    h.insert_fresh([1, 2, 4])
    text = h.cache.pretty_print()
    assert "RadixCache" in text and text.count("TreeNode") == 3
    assert "evictable=4" in repr(h.cache)


# ---------------------------------------------------------------------------- randomized

@pytest.mark.parametrize("page_size", [1, 2, 4])
def test_randomized_requests_keep_invariant(page_size):
    rng = random.Random(1000 + page_size)
    ctx = 40
    h = Harness(size=150, rows=6, ctx=ctx, page_size=page_size)
    prefixes = [[rng.randrange(3) for _ in range(rng.randrange(4, 16))] for _ in range(4)]
    finished = unfinished = evicted = hits = 0
    for _ in range(300):
        op = rng.random()
        if op < 0.3 and h.pool.available_size():
            base = rng.choice(prefixes)
            prompt = base[:rng.randrange(1, len(base) + 1)]
            prompt = prompt + [rng.randrange(3) for _ in range(rng.randrange(1, 12))]
            r = h.req(prompt)
            m = h.admit(r, match_len=len(prompt) - 1)  # the last prompt token is computed
            hits += m.prefix_len
            if not h.extend(r, min(r.seq_len, r.kv_len + rng.randrange(1, 16))):
                h.finish(r)  # could not fit: abort
        elif op < 0.5 and h.running:  # prefill chunk, usually followed by caching it
            r = rng.choice(h.running)
            if r.kv_len < r.seq_len:
                if not h.extend(r, min(r.seq_len, r.kv_len + rng.randrange(1, 16))):
                    h.finish(r)
                    continue
            if rng.random() < 0.6:
                h.cache.cache_unfinished_req(r)
                unfinished += 1
        elif op < 0.7 and h.running:  # decode step
            r = rng.choice(h.running)
            if r.seq_len < ctx - 1 and h.extend(r, r.seq_len):
                r.output_ids.append(rng.randrange(3))  # kv_len == seq_len - 1 now
        elif op < 0.85 and h.running:
            h.finish(rng.choice(h.running))
            finished += 1
        elif op < 0.92:
            evicted += h.cache.evict(rng.randrange(1, 30))
        else:  # an unlocked lookup of some random key
            key = rng.choice(prefixes) + [rng.randrange(3) for _ in range(rng.randrange(0, 6))]
            h.check_slots(h.cache.match_prefix(key).device_indices, key)
        h.check()
    assert finished and unfinished and evicted and hits  # every path was exercised
    for r in list(h.running):
        h.finish(r)
    h.check()
    h.cache.reset()
    assert h.alloc.available_size() == 150 and h.pool.available_size() == 6
    h.check()
