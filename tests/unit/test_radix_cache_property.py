"""RadixCache against a naive reference model, driven by hypothesis state machines.

The reference stores every cached sequence as the set `P` of its page-aligned prefixes
(prefix-closed: caching `abcd` with page_size 2 caches `ab` and `abcd`), with the LRU time
of each page (the tick of the last match/insert whose path covered it) and the sequences
locked by standalone matches and by running requests. Random interleavings of insert,
match, lock, unlock, evict and the scheduler's request lifecycle (admit, extend,
cache_unfinished_req, cache_finished_req) over a 3-token alphabet (so prefixes collide
and nodes split) check, after every step:

* the tree spells exactly `P` (so a match never exceeds what was inserted and equals the
  longest cached prefix); eviction is modelled by taking the tree's surviving paths, after
  checking that they are a subset of `P` that keeps every locked path;
* match / insert lengths equal the reference's longest page-aligned prefix;
* `evictable + protected == total == page_size * |P|`, `protected` = the locked pages;
* eviction frees unlocked pages only, least recently used first (every evicted page is
  older than every surviving unlocked leaf), at least what was asked unless nothing
  evictable is left, and no more than one edge beyond it;
* every slot 1..size is exactly one of free / in one tree node / owned by a running
  request (so duplicates are freed on insert), `check_pool_invariant` holds, and a
  slot -> (position, token) side table agrees with every tree edge and request row;
* page alignment of every edge for page_size in {1, 2, 4}, on a token-granular allocator
  (the page is only the granularity of sharing) and on a paged allocator of the same or a
  smaller page (every node then holds whole KV pages; a request owns its partly filled last
  page whole, and request slots come from `alloc_extend` as the scheduler's do).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixlm.mem import KVSlotAllocator, ReqToTokenPool, check_pool_invariant
from radixlm.mem.radix_cache import RadixCache, TreeNode
from radixlm.sampling_params import SamplingParams
from radixlm.scheduler.req import Req

POOL_SLOTS = 40
ROWS = 3
MAX_KEY = 12
ALPHABET = st.integers(min_value=0, max_value=2)
# Keys start with one of a few stems so that requests and inserts often share long
# prefixes (and a request's computed tokens get inserted meanwhile by another caller).
STEMS = [(), (0, 1, 2, 0), (0, 1, 2, 0, 1, 1, 2, 2), (1, 1, 0, 2, 2, 0), (0, 1)]


def _keys(min_size: int) -> st.SearchStrategy[list[int]]:
    return st.builds(lambda stem, tail: list(stem + tuple(tail))[:MAX_KEY],
                     st.sampled_from(STEMS), st.lists(ALPHABET, max_size=8)
                     ).filter(lambda k: len(k) >= min_size)


KEYS = _keys(0)

Seq = tuple[int, ...]


def node_path(cache: RadixCache, node: TreeNode) -> Seq:
    """The tokens spelled from the root to the end of `node`."""
    parts = []
    while node is not cache.root:
        assert node.parent is not None, "node detached from the tree"
        parts.append(node.key)
        node = node.parent
    return tuple(t for key in reversed(parts) for t in key)


class RadixCacheMachine(RuleBasedStateMachine):
    page_size = 1    # the cache's
    alloc_page = 1   # the KV allocator's (divides page_size)

    def __init__(self) -> None:
        super().__init__()
        p = self.page_size
        self.alloc = KVSlotAllocator(POOL_SLOTS, page_size=self.alloc_page)
        self.pool = ReqToTokenPool(ROWS, MAX_KEY + 4)
        self.cache = RadixCache(self.pool, self.alloc, page_size=p)
        # --- the reference model
        self.ref: set[Seq] = set()           # page-aligned cached sequences (prefix-closed, no ())
        self.atime: dict[Seq, int] = {}      # last access tick of each cached page
        self.clock = 0
        self.locks: list[tuple[TreeNode, Seq]] = []  # standalone match locks
        self.running: list[Req] = []
        self.slot_info: dict[int, tuple[int, int]] = {}  # slot -> (position, token)
        self.n_req = 0

    # ------------------------------------------------------------------ reference helpers

    def aligned(self, n: int) -> int:
        return n - n % self.page_size

    def pages(self, seq: Seq) -> list[Seq]:
        """The non-empty page-aligned prefixes of `seq` (cut to a page multiple)."""
        p = self.page_size
        return [tuple(seq[:i]) for i in range(p, self.aligned(len(seq)) + 1, p)]

    def ref_match(self, key) -> int:
        n = 0
        for pre in self.pages(tuple(key)):
            if pre not in self.ref:
                break
            n = len(pre)
        return n

    def touch(self, seq: Seq) -> None:
        """Refresh the pages of `seq` (all cached) as match_prefix/insert do."""
        self.clock += 1
        for pre in self.pages(seq):
            assert pre in self.ref
            self.atime[pre] = self.clock

    def ref_insert(self, seq: Seq) -> None:
        for pre in self.pages(seq):
            self.ref.add(pre)
        self.touch(seq)

    def locked_seqs(self) -> list[Seq]:
        seqs = [s for _, s in self.locks]
        seqs += [tuple(r.fill_ids[:r.cached_len]) for r in self.running]
        return seqs

    def locked_pages(self) -> set[Seq]:
        return {pre for s in self.locked_seqs() for pre in self.pages(s)}

    def tree_paths(self) -> set[Seq]:
        """Every page-aligned prefix the tree spells (white-box walk of the nodes)."""
        out: set[Seq] = set()
        stack: list[tuple[TreeNode, Seq]] = [(c, ()) for c in self.cache.root.children.values()]
        while stack:
            node, base = stack.pop()
            full = base + tuple(node.key)
            for i in range(self.page_size, len(node.key) + 1, self.page_size):
                out.add(base + tuple(node.key[:i]))
            stack.extend((c, full) for c in node.children.values())
        return out

    def check_slots(self, slots: torch.Tensor, key) -> None:
        for pos, s in enumerate(slots.tolist()):
            assert self.slot_info.get(s) == (pos, key[pos]), f"slot {s} at position {pos}"

    def record(self, slots: torch.Tensor, key, start: int) -> None:
        for i, s in enumerate(slots.tolist()):
            self.slot_info[s] = (start + i, key[start + i])

    def alloc_fresh(self, key) -> torch.Tensor | None:
        """Whole allocator pages covering len(key) slots (evicting, checked, when short)."""
        n = -(-len(key) // self.alloc_page) * self.alloc_page
        short = n - self.alloc.available_size()
        if short > 0:
            self.checked_evict(short)
        slots = self.alloc.alloc(n)
        if slots is not None:
            self.record(slots[:len(key)], key, 0)
        return slots

    def alloc_positions(self, req: Req, upto: int) -> torch.Tensor | None:
        """Slots for positions [kv_len, upto) of req as the scheduler gets them: its partly
        filled last page first, then fresh pages (evicting, checked, when short)."""
        prefix = torch.tensor([req.kv_len])
        ext = torch.tensor([upto - req.kv_len])
        short = self.alloc.new_slots_needed(prefix, prefix + ext) - self.alloc.available_size()
        if short > 0:
            self.checked_evict(short)
        last = self.pool.req_to_token[req.req_pool_idx, max(req.kv_len - 1, 0)].to(torch.int64)
        slots = self.alloc.alloc_extend(prefix, ext, last.reshape(1))
        if slots is not None:
            self.record(slots, req.fill_ids, req.kv_len)
        return slots

    def checked_evict(self, n: int) -> int:
        cache = self.cache
        before = set(self.ref)
        locked = self.locked_pages()
        free_before = self.alloc.available_size()
        max_edge = max((len(x.key) for x in cache._iter_nodes() if x.lock_ref == 0), default=0)
        freed = cache.evict(n)
        after = self.tree_paths()
        removed = before - after
        assert after <= before, "eviction created cache entries"
        assert not (removed & locked), "a locked path was evicted"
        assert freed == self.page_size * len(removed) == self.alloc.available_size() - free_before
        if n <= 0:
            assert freed == 0
        else:
            assert freed >= n or cache.evictable_size() == 0, (freed, n)
            assert freed < n + max_edge, "evicted more than one edge beyond the request"
        if removed:
            # LRU: the tree evicts the least recently used unlocked leaf, repeatedly; so no
            # evicted page is newer than any unlocked leaf that survives.
            p = self.page_size
            leaves = [s for s in after if s not in locked
                      and not any(c[:len(s)] == s for c in after if len(c) == len(s) + p)]
            newest_evicted = max(self.atime[s] for s in removed)
            if leaves:
                assert newest_evicted <= min(self.atime[s] for s in leaves), "not LRU order"
        self.ref = after
        for s in removed:
            del self.atime[s]
        return freed

    # ------------------------------------------------------------------ rules: raw cache API

    @rule(key=KEYS)
    def insert(self, key):
        slots = self.alloc_fresh(key)
        if slots is None:
            return
        want = self.ref_match(key)
        got = self.cache.insert(key, slots[:len(key)])
        assert got == want, f"insert returned {got}, reference has {want} cached"
        aligned = self.aligned(len(key))
        # The caller frees what the tree already had, and the unaligned tail (whole pages:
        # both ranges start at a page boundary).
        self.alloc.free(torch.cat([slots[:got], slots[aligned:]]))
        self.ref_insert(tuple(key))

    @rule(key=KEYS, lock=st.booleans())
    def match(self, key, lock):
        m = self.cache.match_prefix(key)
        want = self.ref_match(key)
        assert m.prefix_len == want, f"matched {m.prefix_len}, reference {want}"
        assert m.prefix_len % self.page_size == 0
        self.check_slots(m.device_indices, key)
        assert node_path(self.cache, m.last_node) == tuple(key[:want])
        self.touch(tuple(key[:want]))
        if lock:
            self.cache.inc_lock_ref(m.last_node)
            self.locks.append((m.last_node, tuple(key[:want])))

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock(self, data):
        i = data.draw(st.integers(0, len(self.locks) - 1))
        node, _ = self.locks.pop(i)
        self.cache.dec_lock_ref(node)

    @rule(n=st.integers(min_value=-1, max_value=20))
    def evict(self, n):
        self.checked_evict(n)

    # ------------------------------------------------------------------ rules: request hooks

    @precondition(lambda self: self.pool.available_size() > 0)
    @rule(key=_keys(1))
    def admit(self, key):
        """As the scheduler: match all but the last token, lock, take a row."""
        self.n_req += 1
        req = Req(rid=f"r{self.n_req}", input_ids=list(key), sampling_params=SamplingParams())
        m = self.cache.match_prefix(req.fill_ids[:req.seq_len - 1])
        want = self.ref_match(key[:-1])
        assert m.prefix_len == want
        self.check_slots(m.device_indices, key)
        self.touch(tuple(key[:want]))
        self.cache.inc_lock_ref(m.last_node)
        row = self.pool.alloc()
        self.pool.write(row, 0, m.device_indices)
        req.req_pool_idx, req.last_node = row, m.last_node
        req.cached_len = req.kv_len = m.prefix_len
        self.running.append(req)

    @precondition(lambda self: any(r.kv_len < r.seq_len for r in self.running))
    @rule(data=st.data())
    def extend(self, data):
        """Compute K/V for positions [kv_len, upto) and cache them (cache_unfinished_req)."""
        req = data.draw(st.sampled_from([r for r in self.running if r.kv_len < r.seq_len]))
        upto = data.draw(st.integers(req.kv_len + 1, req.seq_len))
        slots = self.alloc_positions(req, upto)
        if slots is None:
            return
        self.pool.write(req.req_pool_idx, req.kv_len, slots)
        req.kv_len = upto
        if data.draw(st.booleans()):
            old_cached = req.cached_len
            self.cache.cache_unfinished_req(req)
            seq = tuple(req.fill_ids[:self.aligned(upto)])
            self.ref_insert(seq)
            assert req.cached_len == len(seq) >= old_cached
            assert node_path(self.cache, req.last_node) == seq

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data):
        req = data.draw(st.sampled_from(self.running))
        seq = tuple(req.fill_ids[:self.aligned(req.kv_len)])
        rows_before = self.pool.available_size()
        self.cache.cache_finished_req(req)
        self.running.remove(req)
        self.ref_insert(seq)
        assert req.req_pool_idx is None and req.kv_len == 0 and req.last_node is None
        assert self.pool.available_size() == rows_before + 1

    # ------------------------------------------------------------------ invariants

    @invariant()
    def tree_equals_reference(self):
        cache = self.cache
        cache.check_tree()
        assert self.tree_paths() == self.ref
        p = self.page_size
        assert cache.total_size() == p * len(self.ref)
        assert cache.evictable_size() + cache.protected_size() == cache.total_size()
        assert cache.protected_size() == p * len(self.locked_pages())
        # lock_ref of each node == the locks whose path runs through it
        expected: dict[int, int] = {}
        lock_nodes = [n for n, _ in self.locks] + [r.last_node for r in self.running]
        for node in lock_nodes:
            while node is not cache.root:
                expected[node.id] = expected.get(node.id, 0) + 1
                node = node.parent
        for node in cache._iter_nodes():
            assert node.lock_ref == expected.get(node.id, 0), node

    @invariant()
    def slots_partitioned(self):
        cache = self.cache
        pa = self.alloc_page
        held = sum(cache.held_by_request(r, pa) for r in self.running)
        check_pool_invariant(self.alloc, held, cache.total_size())
        cache.check_invariant(self.running)
        parts = [self.alloc.free_slots]
        stack: list[tuple[TreeNode, int]] = [(c, 0) for c in cache.root.children.values()]
        while stack:
            node, depth = stack.pop()
            for i, s in enumerate(node.value.tolist()):
                assert self.slot_info[s] == (depth + i, node.key[i]), f"tree slot {s}"
            # A node holds whole allocator pages, each in slot order from its offset 0.
            pages = node.value.reshape(-1, pa)
            assert torch.equal((pages[:, 0] - 1) % pa, torch.zeros_like(pages[:, 0])), node
            assert torch.equal(pages - pages[:, :1], torch.arange(pa).expand_as(pages)), node
            parts.append(node.value)
            stack.extend((c, depth + len(node.key)) for c in node.children.values())
        for r in self.running:
            row = self.pool.req_to_token[r.req_pool_idx, :r.kv_len].to(torch.int64)
            self.check_slots(row, r.fill_ids)
            assert r.cached_len % self.page_size == 0
            own = row[r.cached_len:]
            if own.numel():  # its pages, the partly filled last one whole
                first = torch.unique((own - 1) // pa)
                parts.append(self.alloc.pages_to_slots(first))
                assert first.numel() * pa == cache.held_by_request(r, pa)
            else:
                assert cache.held_by_request(r, pa) == 0
        every = torch.sort(torch.cat(parts)).values
        assert torch.equal(every, torch.arange(1, POOL_SLOTS + 1)), "a slot is owned twice or lost"


def _settings(examples: int) -> settings:
    return settings(max_examples=examples, stateful_step_count=40, deadline=None,
                    database=None, suppress_health_check=[HealthCheck.too_slow])


def _machine(page: int, alloc_page: int, examples: int):
    cls = type(f"Page{page}Alloc{alloc_page}Machine", (RadixCacheMachine,),
               {"page_size": page, "alloc_page": alloc_page})
    case = cls.TestCase
    case.settings = _settings(examples)
    return case


# cache page / allocator page: token-granular allocator, then paged ones (as the scheduler
# runs with --page-size: the same page for both), and a cache page of two allocator pages.
TestPage1 = _machine(1, 1, 50)
TestPage2TokenAllocator = _machine(2, 1, 25)
TestPage4TokenAllocator = _machine(4, 1, 25)
TestPage2Paged = _machine(2, 2, 35)
TestPage4Paged = _machine(4, 4, 35)
TestPage4OnPage2Allocator = _machine(4, 2, 25)


def test_cache_page_must_be_a_multiple_of_the_allocator_page():
    with pytest.raises(ValueError, match="multiple"):
        RadixCache(ReqToTokenPool(1, 8), KVSlotAllocator(16, page_size=4), page_size=2)
