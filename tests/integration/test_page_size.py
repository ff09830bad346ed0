"""--page-size on a tiny random Llama: greedy outputs identical for page 1, 4 and 16 (radix
cache on, chunk sizes that are not page multiples, a pool small enough to retract), prefix
matches in whole pages, and the pool invariant (in slots, a partly filled page held whole)
after every step."""

from __future__ import annotations

import random

import pytest

from radixlm import SamplingParams
from radixlm.engine import Engine
from tests.engine_checks import assert_all_slots_back as all_back, run_staggered


def prompts(n: int, seed: int, lo: int = 20, hi: int = 70) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 256) for _ in range(rng.randrange(lo, hi))] for _ in range(n)]


def greedy(max_new: int = 12) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    return Engine(model=tiny_llama_dir, max_total_tokens=4096, chunked_prefill_size=-1,
                  disable_radix_cache=True)


@pytest.mark.parametrize("page", [1, 4, 16])
@pytest.mark.parametrize("chunk", [7, 13])
def test_outputs_identical_across_page_sizes_with_chunks_and_retraction(
        tiny_llama_dir, reference, page, chunk):
    base = prompts(1, seed=50)[0]
    # Shared prefixes (radix hits at page granularity) and independent prompts.
    ps = [base + p for p in prompts(3, seed=51, lo=3, hi=20)] + prompts(4, seed=52)
    want = [o["output_ids"] for o in reference.generate(ps, greedy(40))]
    eng = Engine(model=tiny_llama_dir, max_total_tokens=300, chunked_prefill_size=chunk,
                 page_size=page, max_running_requests=8)
    assert eng.scheduler.runner.allocator.size == 300 // page * page
    assert run_staggered(eng, ps, greedy(40), seed=page + chunk) == want
    assert eng.scheduler.num_retractions > 0
    all_back(eng)
    # A second round on the warm cache: same outputs, served from page-aligned prefixes.
    got = eng.generate(ps, greedy(40))
    assert [g["output_ids"] for g in got] == want
    assert all(g["meta_info"]["cached_tokens"] % page == 0 for g in got)
    assert any(g["meta_info"]["cached_tokens"] >= page for g in got)
    all_back(eng)


@pytest.mark.parametrize("page", [4, 16])
def test_prefix_hits_are_whole_pages(tiny_llama_dir, page):
    eng = Engine(model=tiny_llama_dir, max_total_tokens=2048, page_size=page)
    shared = prompts(1, seed=60, lo=37, hi=38)[0]  # 37 tokens: not a page multiple
    a, b = shared + [7, 8, 9], shared + [10, 11]
    first = eng.generate(a, greedy())
    second = eng.generate(b, greedy())
    # The cache holds a's prompt + output in whole pages; b shares its 37 tokens.
    assert second["meta_info"]["cached_tokens"] == 37 - 37 % page
    again = eng.generate(a, greedy())
    assert again["meta_info"]["cached_tokens"] == (len(a) - 1) // page * page
    assert again["output_ids"] == first["output_ids"]
    all_back(eng)
    assert eng.scheduler.flush_cache().success
    assert eng.scheduler.runner.allocator.available_size() == eng.scheduler.runner.allocator.size


def test_disabled_cache_abort_and_seeded_sampling_with_pages(tiny_llama_dir, reference):
    ps = prompts(4, seed=70)
    seeded = SamplingParams(max_new_tokens=15, temperature=1.0, seed=3, ignore_eos=True)
    want = [o["output_ids"] for o in reference.generate(ps, seeded)]
    eng = Engine(model=tiny_llama_dir, max_total_tokens=512, page_size=8,
                 chunked_prefill_size=11, disable_radix_cache=True)
    assert run_staggered(eng, ps, seeded, seed=1) == want
    all_back(eng)
    assert eng.scheduler.runner.allocator.available_size() == 512
    rid = eng.submit(list(range(3, 83)), greedy(), stream=True)  # chunks of 11
    eng.step()
    eng.step()
    eng.check_invariant()
    eng.abort(rid)
    eng.run_until_done([rid])
    assert eng.result(rid)["meta_info"]["finish_reason"] == "abort"
    all_back(eng)


def test_pool_stats_count_slots_of_partly_filled_pages(tiny_llama_dir):
    eng = Engine(model=tiny_llama_dir, max_total_tokens=640, page_size=16)
    rid = eng.submit(list(range(3, 24)), greedy(30))  # 21 tokens: 2 pages, 11 slots unused
    eng.step()
    stats = eng.scheduler.pool_stats("x")
    assert stats.invariant_error is None and stats.page_size == 16
    # 21 prompt + 0 computed output: 16 in the cache (a whole page), the request's page whole.
    assert stats.held_by_cache == 16 and stats.held_by_requests == 16
    assert stats.free_kv_slots == 640 - 32
    eng.run_until_done([rid])
    all_back(eng)


def test_page_size_larger_than_the_pool_is_refused(tiny_llama_dir):
    with pytest.raises(ValueError, match="page-size"):
        Engine(model=tiny_llama_dir, max_total_tokens=8, page_size=16)
