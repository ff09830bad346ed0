"""KVSlotAllocator with pages: layout, extend/decode allocation arithmetic, whole-page frees,
and a RadixCache on top of it (request hooks free partly filled pages correctly).

A reference model fills requests position by position in Python; the vectorized
`alloc_extend` / `alloc_decode` must agree with it: position i of a request lives at offset
i % page of its (i // page)-th page.
"""

from __future__ import annotations

import random

import pytest
import torch

from radixlm.mem import KVSlotAllocator, PoolInvariantError, ReqToTokenPool, check_pool_invariant
from radixlm.mem.radix_cache import RadixCache
from radixlm.sampling_params import SamplingParams
from radixlm.scheduler.prefill_adder import PrefillAdder
from radixlm.scheduler.req import Req


def page_of(slot: int, page: int) -> int:
    return (slot - 1) // page


def offset_of(slot: int, page: int) -> int:
    return (slot - 1) % page


def test_layout_size_rounded_down_and_dummy_slot_never_handed_out():
    a = KVSlotAllocator(10, page_size=4)
    assert (a.num_pages, a.size, a.available_size()) == (2, 8, 8)
    assert sorted(a.free_slots.tolist()) == list(range(1, 9))
    s = a.alloc(8)
    assert s.tolist() == [1, 2, 3, 4, 5, 6, 7, 8]  # page p = slots p*4+1 .. (p+1)*4
    assert a.alloc(4) is None and a.available_size() == 0
    with pytest.raises(ValueError):
        a.alloc(3)  # not whole pages
    with pytest.raises(ValueError):
        KVSlotAllocator(3, page_size=4)
    with pytest.raises(ValueError):
        KVSlotAllocator(8, page_size=0)


def test_page_size_one_is_the_plain_slot_allocator():
    a = KVSlotAllocator(5)
    out = a.alloc_extend(torch.tensor([0, 3]), torch.tensor([2, 1]), torch.tensor([0, 9]))
    assert out.tolist() == [1, 2, 3]
    assert a.alloc_decode(torch.tensor([7]), torch.tensor([2])).tolist() == [4]
    a.free(torch.tensor([2, 4]))
    assert a.available_size() == 3
    check_pool_invariant(a, held_by_requests=2)


def test_extend_fills_the_partly_filled_last_page_first():
    a = KVSlotAllocator(64, page_size=4)
    # request 0: fresh, 6 tokens -> 2 pages; request 1: has 2 tokens in a page starting at
    # slot 41 (its position 1 is slot 42) and extends by 5 -> 2 more positions in that
    # page, then 3 in one fresh page.
    a.free_pages = a.free_pages[a.free_pages != 10]  # page 10 = slots 41..44 is request 1's
    slots = a.alloc_extend(torch.tensor([0, 2]), torch.tensor([6, 5]), torch.tensor([0, 42]))
    s = slots.tolist()
    assert len(s) == 11
    r0, r1 = s[:6], s[6:]
    assert [offset_of(x, 4) for x in r0] == [0, 1, 2, 3, 0, 1]
    assert page_of(r0[0], 4) == page_of(r0[3], 4) != page_of(r0[4], 4) == page_of(r0[5], 4)
    assert r1[:2] == [43, 44]
    assert [offset_of(x, 4) for x in r1[2:]] == [0, 1, 2]
    assert len({page_of(x, 4) for x in r1[2:]}) == 1
    assert a.available_size() == 64 - 4 - 3 * 4  # page 10 + 3 fresh pages
    assert a.new_slots_needed(torch.tensor([0, 2]), torch.tensor([6, 7])) == 12


def test_decode_takes_a_page_only_at_page_aligned_positions():
    a = KVSlotAllocator(32, page_size=4)
    out = a.alloc_decode(torch.tensor([4, 5, 0]), torch.tensor([12, 22, 0]))
    o = out.tolist()
    assert offset_of(o[0], 4) == 0 and o[1] == 23 and offset_of(o[2], 4) == 0
    assert page_of(o[0], 4) != page_of(o[2], 4)
    assert a.available_size() == 32 - 8
    # short: nothing taken
    a.alloc(a.available_size())
    assert a.alloc_decode(torch.tensor([8, 3]), torch.tensor([0, 7])) is None
    assert a.alloc_decode(torch.tensor([3]), torch.tensor([7])).tolist() == [8]  # no page needed


def test_extend_is_all_or_nothing():
    a = KVSlotAllocator(16, page_size=4)
    assert a.alloc_extend(torch.tensor([0, 0]), torch.tensor([9, 8]), torch.tensor([0, 0])) is None
    assert a.available_size() == 16


def test_free_takes_back_whole_pages_by_their_first_slot():
    a = KVSlotAllocator(16, page_size=4)
    s = a.alloc_extend(torch.tensor([0]), torch.tensor([6]), torch.tensor([0]))  # 1.5 pages
    assert a.available_size() == 8
    check_pool_invariant(a, held_by_requests=8)  # the partly filled page is held whole
    a.free(s[4:])  # the tail [4, 6): its first slot is a page start -> the whole page
    assert a.available_size() == 12
    a.free(s[1:4])  # no page start in it: nothing (the caller broke the rule -> a leak)
    with pytest.raises(PoolInvariantError):
        check_pool_invariant(a, held_by_requests=0)
    a.free(s[:1])
    check_pool_invariant(a, held_by_requests=0)
    a.free(s[:4])  # double free is caught by the invariant check
    with pytest.raises(PoolInvariantError):
        check_pool_invariant(a, held_by_requests=-4)


@pytest.mark.parametrize("page", [1, 2, 4, 16])
def test_vectorized_allocation_matches_the_position_by_position_model(page):
    """Random extends and decodes of several requests: every slot is offset i % page of
    the request's (i // page)-th page, no slot is handed out twice, frees give pages back."""
    rng = random.Random(page)
    a = KVSlotAllocator(4096, page_size=page)
    rows: dict[int, list[int]] = {b: [] for b in range(5)}
    for _ in range(40):
        bs = rng.sample(list(rows), rng.randrange(1, 5))
        if rng.random() < 0.5:
            prefix = torch.tensor([len(rows[b]) for b in bs])
            ext = torch.tensor([rng.randrange(0, 11) for _ in bs])
            last = torch.tensor([rows[b][-1] if rows[b] else 0 for b in bs])
            out = a.alloc_extend(prefix, ext, last).tolist()
            for b, n in zip(bs, ext.tolist()):
                rows[b].extend(out[:n])
                out = out[n:]
        else:
            pos = torch.tensor([len(rows[b]) for b in bs])
            last = torch.tensor([rows[b][-1] if rows[b] else 0 for b in bs])
            for b, s in zip(bs, a.alloc_decode(pos, last).tolist()):
                rows[b].append(s)
        if rng.random() < 0.15:  # a request finishes: all its pages back
            b = rng.choice(list(rows))
            a.free(torch.tensor(rows[b], dtype=torch.int64))
            rows[b] = []
        used = [s for r in rows.values() for s in r]
        assert len(used) == len(set(used)), "a slot handed out twice"
        for r in rows.values():
            for i, s in enumerate(r):
                assert offset_of(s, page) == i % page
                # in the same page as the position that started that page
                assert page_of(s, page) == page_of(r[i - i % page], page)
        held = sum(-(-len(r) // page) * page for r in rows.values())
        check_pool_invariant(a, held_by_requests=held)


# --- a RadixCache on a paged allocator ------------------------------------------------------


def make_req(ids: list[int], name: str) -> Req:
    return Req(rid=name, input_ids=list(ids), sampling_params=SamplingParams())


class PagedHarness:
    """Plays the scheduler with a paged allocator: admit (page-granular match), extend via
    alloc_extend, cache between chunks and at the end."""

    def __init__(self, page: int, size: int = 256) -> None:
        self.page = page
        self.alloc = KVSlotAllocator(size, page_size=page)
        self.pool = ReqToTokenPool(8, 128)
        self.cache = RadixCache(self.pool, self.alloc, page_size=page)
        self.running: list[Req] = []

    def admit(self, req: Req) -> None:
        m = self.cache.match_prefix(req.fill_ids[:req.seq_len - 1])
        assert m.prefix_len % self.page == 0
        self.cache.inc_lock_ref(m.last_node)
        req.req_pool_idx = self.pool.alloc()
        self.pool.write(req.req_pool_idx, 0, m.device_indices)
        req.last_node, req.cached_len, req.kv_len = m.last_node, m.prefix_len, m.prefix_len
        self.running.append(req)

    def extend(self, req: Req, n: int) -> None:
        row = req.req_pool_idx
        last = self.pool.req_to_token[row, max(req.kv_len - 1, 0)].long().reshape(1)
        slots = self.alloc.alloc_extend(torch.tensor([req.kv_len]), torch.tensor([n]), last)
        self.pool.write(row, req.kv_len, slots)
        req.kv_len += n

    def check(self) -> None:
        self.cache.check_tree()
        self.cache.check_invariant(self.running)
        for r in self.running:  # positions fill pages in order
            row = self.pool.req_to_token[r.req_pool_idx, :r.kv_len].tolist()
            for i, s in enumerate(row):
                assert offset_of(s, self.page) == i % self.page


@pytest.mark.parametrize("page", [2, 4])
def test_radix_cache_on_paged_allocator_frees_partial_pages_whole(page):
    h = PagedHarness(page)
    total = h.alloc.size
    a = make_req(list(range(10, 21)), "a")  # 11 tokens: unaligned
    h.admit(a)
    h.extend(a, 5)  # a chunk ending inside a page
    h.cache.cache_unfinished_req(a)
    assert a.cached_len == 5 - 5 % page
    h.check()
    h.extend(a, 6)
    h.cache.cache_unfinished_req(a)
    h.check()
    b = make_req(list(range(10, 21)) + [99, 98], "b")  # shares a's 11 tokens
    h.admit(b)
    assert b.cached_len == 11 - 11 % page
    h.extend(b, b.seq_len - b.kv_len)
    h.check()
    for r in (a, b):
        h.cache.cache_finished_req(r)
        h.running.remove(r)
        h.check()
    assert h.cache.protected_size() == 0
    assert h.alloc.available_size() + h.cache.evictable_size() == total
    h.cache.evict(total)
    assert h.alloc.available_size() == total
    assert sorted(h.alloc.free_slots.tolist()) == list(range(1, total + 1))


def test_radix_cache_page_size_must_be_a_multiple_of_the_allocator_page():
    with pytest.raises(ValueError):
        RadixCache(ReqToTokenPool(2, 16), KVSlotAllocator(16, page_size=4), page_size=2)
    RadixCache(ReqToTokenPool(2, 16), KVSlotAllocator(16, page_size=4), page_size=8)


# --- PrefillAdder in pages -------------------------------------------------------------------


def test_prefill_adder_counts_fresh_pages_and_truncates_chunks_to_whole_pages():
    r = make_req(list(range(3, 3 + 10)), "r")
    r.kv_len = 2  # two positions in a partly filled page of 4
    a = PrefillAdder(free_kv_slots=100, free_rows=1, prefill_budget=100, chunking=True,
                     running=[], new_token_ratio=0.0, page_size=4)
    assert a.kv_cost(r, 2) == 0 and a.kv_cost(r, 3) == 4 and a.kv_cost(r, 8) == 8
    assert a.max_tokens_within(r, 7) == 2 + 4  # rest of its page + one fresh page
    small = PrefillAdder(free_kv_slots=5, free_rows=1, prefill_budget=100, chunking=True,
                         running=[], new_token_ratio=0.0, page_size=4)
    assert small.try_add(r)
    assert r.extend_input_len == 6 and small.kv_budget == 1


def test_prefill_adder_mixed_reserves_the_running_decodes():
    running = make_req([5, 6, 7, 8], "run")
    running.output_ids = [9]
    running.kv_len, running.req_pool_idx = 4, 0  # next position 4: a fresh page of 4
    a = PrefillAdder(free_kv_slots=50, free_rows=1, prefill_budget=16, chunking=True,
                     running=[running], new_token_ratio=0.0, page_size=4, mixed_with_running=True)
    assert a.kv_budget == 50 - 4 and a.prefill_budget == 15
    running.input_ids.append(10)
    running.kv_len = 5  # next position 5 is mid-page: no fresh page
    b = PrefillAdder(free_kv_slots=50, free_rows=1, prefill_budget=16, chunking=True,
                     running=[running], new_token_ratio=0.0, page_size=4, mixed_with_running=True)
    assert b.kv_budget == 50
    c = PrefillAdder(free_kv_slots=50, free_rows=1, prefill_budget=16, chunking=True,
                     running=[running], new_token_ratio=0.0, page_size=1, mixed_with_running=True)
    assert c.kv_budget == 49  # one slot each at page 1
