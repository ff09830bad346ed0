"""Stress: a few hundred requests forming a random prefix tree, sent at once to a small pool.

Every prompt is root segment + middle segment + leaf segment, drawn from a seeded depth-3
tree of shared segments over the tiny random Llama's vocabulary, so prompts share long
prefixes at two levels. All are submitted together (in shuffled order) to an engine with a
KV pool far smaller than the working set, 16 running requests at most and 16-token chunks:
admission, in-batch prefix sharing, chunked prefill through the radix cache, LRU eviction
and decode retraction all run many times. Every output must equal a reference engine's
(no radix cache, no chunking, a large pool), many requests must be served partly from the
cache, the pool invariant must hold after every step, and every slot must come back.
Variants: fcfs, lpm, bold admission on a smaller pool (decode retracts), and the same with
--page-size 4 (lpm) and --page-size 4 plus --enable-mixed-chunk (retracting).
"""

from __future__ import annotations

import random

import pytest

from radixlm import SamplingParams
from radixlm.engine import Engine
from tests.engine_checks import assert_all_slots_back

POOL = 600
MAX_NEW = 8
VOCAB = 256


def prefix_tree_prompts(seed: int = 0) -> list[list[int]]:
    """4 roots x 4 middles x 13 leaves = 208 prompts of ~40-75 tokens."""
    rng = random.Random(seed)

    def seg(lo: int, hi: int) -> list[int]:
        return [rng.randrange(3, VOCAB) for _ in range(rng.randrange(lo, hi + 1))]

    prompts = []
    for _ in range(4):
        root = seg(20, 36)
        for _ in range(4):
            mid = seg(8, 24)
            for _ in range(13):
                prompts.append(root + mid + seg(2, 14))
    rng.shuffle(prompts)
    return prompts


def greedy() -> SamplingParams:
    return SamplingParams(max_new_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    ps = prefix_tree_prompts()
    assert len(ps) >= 200
    return ps


@pytest.fixture(scope="module")
def expected(tiny_llama_dir, prompts) -> list[list[int]]:
    ref = Engine(model=tiny_llama_dir, max_total_tokens=16384, max_running_requests=64,
                 disable_radix_cache=True, chunked_prefill_size=-1)
    outs = ref.generate(prompts, greedy())
    assert all(o["meta_info"]["cached_tokens"] == 0 for o in outs)
    ref.check_invariant()
    return [o["output_ids"] for o in outs]


@pytest.mark.parametrize("policy,pool,ratio,extra", [
    ("fcfs", POOL, 0.7, {}),
    ("lpm", POOL, 0.7, {}),
    # Bold admission (a tiny decode reserve) on an even smaller pool: decode retracts.
    ("fcfs", 300, 0.1, {}),
    # Paged KV (sharing in whole 4-token pages) and decodes riding along prefill chunks.
    ("lpm", POOL, 0.7, {"page_size": 4}),
    ("fcfs", 200, 0.1, {"page_size": 4, "enable_mixed_chunk": True}),
], ids=["fcfs", "lpm", "retract", "lpm-page4", "retract-page4-mixed"])
def test_prefix_tree_burst_on_a_small_pool(tiny_llama_dir, prompts, expected, policy, pool,
                                           ratio, extra):
    eng = Engine(model=tiny_llama_dir, max_total_tokens=pool, max_running_requests=16,
                 chunked_prefill_size=16, schedule_policy=policy, init_new_token_ratio=ratio,
                 min_new_token_ratio=min(ratio, 0.1), **extra)
    evicted = []
    evict = eng.scheduler.tree_cache.evict
    eng.scheduler.tree_cache.evict = lambda n: evicted.append(evict(n)) or evicted[-1]
    s = eng.scheduler
    rids = [eng.submit(p, greedy()) for p in prompts]
    steps = 0
    max_running = 0
    while not all(eng.result(r)["finished"] for r in rids):
        eng.step()
        steps += 1
        max_running = max(max_running, len(s.running))
        eng.check_invariant()  # free + cache + requests == total, rows too, between steps
        assert steps < 20_000, "no progress"
    results = [eng.pop_result(r) for r in rids]
    assert max_running <= 16

    mismatched = [i for i, (r, want) in enumerate(zip(results, expected))
                  if r["output_ids"] != want]
    assert not mismatched, f"{len(mismatched)} outputs differ, first at prompt {mismatched[0]}"
    for r, p in zip(results, prompts):
        meta = r["meta_info"]
        assert meta["finish_reason"] == "length", meta
        assert meta["completion_tokens"] == MAX_NEW and len(r["output_ids"]) == MAX_NEW
        assert meta["prompt_tokens"] == len(p)
        assert 0 <= meta["cached_tokens"] <= len(p) - 1
    cached = [r["meta_info"]["cached_tokens"] for r in results]
    # 16 distinct middles for 208 prompts: most find at least the root segment cached.
    assert sum(c > 0 for c in cached) >= len(prompts) // 2, cached
    assert sum(cached) >= 20 * len(prompts) // 2
    # The working set (~11k prompt tokens) is far larger than the pool: LRU eviction ran.
    assert sum(evicted) > pool
    if ratio < 0.7:
        assert s.num_retractions > 0

    eng.settle()  # overlap: the last launched batch holds only answered requests
    assert not s.has_work()
    assert_all_slots_back(eng, pool)
    assert eng.scheduler.runner.req_to_token_pool.available_size() == \
        eng.scheduler.runner.req_to_token_pool.size
    # A second, identical burst reuses whatever survived and still matches.
    again = eng.generate(prompts[:32], greedy())
    assert [o["output_ids"] for o in again] == expected[:32]
    assert_all_slots_back(eng, pool)
