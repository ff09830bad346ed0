"""Schedule policies (fcfs, lpm), in-batch prefix sharing and the new-token ratio, on a
real RadixCache (policy order) and the tiny random Llama (end to end)."""

from __future__ import annotations

import argparse
import random
from collections import deque

import numpy as np
import pytest

from radixlm import SamplingParams
from radixlm.config import ServerArgs, add_cli_args, from_cli_args
from radixlm.engine import Engine
from radixlm.mem import KVSlotAllocator, ReqToTokenPool
from radixlm.mem.radix_cache import RadixCache
from radixlm.scheduler.policy import (FCFS, IN_BATCH_PREFIX_MIN, LPM, LPM_MAX_QUEUE_LEN,
                                      InBatchPrefixSharing, common_prefix_len, make_policy)
from radixlm.scheduler.req import Req
from tests.engine_checks import assert_all_slots_back as all_back


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 256) for _ in range(n)]


def greedy(max_new: int = 8) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new, temperature=0.0, ignore_eos=True)

# --- policy order on a real RadixCache (no model) ---------------------------------------


def make_cache(disable: bool = False) -> RadixCache:
    return RadixCache(ReqToTokenPool(4, 256), KVSlotAllocator(1024), disable=disable)


def cache_tokens(cache: RadixCache, key: list[int]) -> None:
    cache.insert(key, cache.allocator.alloc(len(key)))


def make_req(rid: str, ids: list[int]) -> Req:
    return Req(rid=rid, input_ids=ids, sampling_params=SamplingParams())


def rids(q) -> list[str]:
    return [r.rid for r in q]


def test_registry():
    assert isinstance(make_policy("fcfs"), FCFS) and isinstance(make_policy("lpm"), LPM)
    with pytest.raises(ValueError, match="fcfs, lpm"):
        make_policy("random")


def test_lpm_orders_by_longest_cached_prefix_stably_and_fcfs_keeps_arrival():
    cache = make_cache()
    a, b = tokens(40, 1), tokens(40, 2)
    cache_tokens(cache, a)
    cache_tokens(cache, b[:20])
    q = deque([make_req("none1", tokens(30, 3)), make_req("b20", b[:20] + [5, 6]),
               make_req("a40", a + [7]), make_req("none2", tokens(30, 4)),
               make_req("a10", a[:10] + [9, 9]), make_req("b20bis", b + [8])])
    FCFS().calc_priority(q, cache)
    assert rids(q) == ["none1", "b20", "a40", "none2", "a10", "b20bis"]
    LPM().calc_priority(q, cache)
    assert rids(q) == ["a40", "b20", "b20bis", "a10", "none1", "none2"]
    assert cache.protected_size() == 0  # matching takes no locks
    cache.check_tree()


def test_lpm_keeps_a_request_holding_a_row_first():
    cache = make_cache()
    a = tokens(40, 1)
    cache_tokens(cache, a)
    chunked = make_req("chunked", tokens(50, 5))
    chunked.req_pool_idx = 2  # a chunked prefill in progress
    q = deque([chunked, make_req("a", a + [1])])
    LPM().calc_priority(q, cache)
    assert rids(q) == ["chunked", "a"]


def test_lpm_falls_back_to_fcfs_on_a_long_queue_or_without_cache():
    cache = make_cache()
    a = tokens(40, 1)
    cache_tokens(cache, a)
    q = deque([make_req(f"r{i}", tokens(10, 100 + i)) for i in range(LPM_MAX_QUEUE_LEN)]
              + [make_req("hit", a + [1])])
    LPM().calc_priority(q, cache)
    assert rids(q)[-1] == "hit"  # 129 waiting: left in arrival order
    q.popleft()
    LPM().calc_priority(q, cache)
    assert rids(q)[0] == "hit"  # 128 waiting: sorted
    off = make_cache(disable=True)
    q = deque([make_req("x", tokens(10, 7)), make_req("hit", a + [1])])
    LPM().calc_priority(q, off)
    assert rids(q) == ["x", "hit"]


def test_common_prefix_len_and_in_batch_sharing_rule():
    x = np.arange(100)
    y = x.copy()
    y[70] = -1
    assert common_prefix_len(x, y) == 70
    assert common_prefix_len(x, x[:40]) == 40
    assert common_prefix_len(x, x + 1) == 0
    shared = tokens(60, 11)
    first = make_req("first", shared + tokens(10, 12))
    first.extend_input_len = first.seq_len
    sharing = InBatchPrefixSharing(enabled=True)
    assert not sharing.should_defer(make_req("c", shared + [1, 2]), 0)  # nothing admitted yet
    sharing.record(first)
    assert sharing.should_defer(make_req("c", shared + tokens(5, 13)), 0)
    # Already cached beyond the shared part, or too little shared: no reason to wait.
    assert not sharing.should_defer(make_req("c", shared + tokens(5, 13)), 60)
    assert not sharing.should_defer(make_req("c", shared + tokens(5, 13)),
                                    60 - IN_BATCH_PREFIX_MIN + 1)
    assert not sharing.should_defer(make_req("c", shared[:IN_BATCH_PREFIX_MIN - 1] + [1, 2]), 0)
    assert not sharing.should_defer(make_req("c", tokens(70, 14)), 0)
    holding = make_req("c", shared + [1, 2])
    holding.req_pool_idx = 0
    assert not sharing.should_defer(holding, 0)
    off = InBatchPrefixSharing(enabled=False)
    off.record(first)
    assert not off.should_defer(make_req("c", shared + [1, 2]), 0)


def test_cli_flags():
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    args = from_cli_args(parser.parse_args(
        ["--schedule-policy", "lpm", "--init-new-token-ratio", "0.5",
         "--min-new-token-ratio", "0.2", "--new-token-ratio-decay", "0.01"]))
    assert (args.schedule_policy, args.init_new_token_ratio, args.min_new_token_ratio,
            args.new_token_ratio_decay) == ("lpm", 0.5, 0.2, 0.01)
    d = ServerArgs()
    assert (d.schedule_policy, d.init_new_token_ratio, d.min_new_token_ratio,
            d.new_token_ratio_decay) == ("fcfs", 0.7, 0.1, None)


# --- end to end on the tiny Llama ---------------------------------------------------------


@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
def test_lpm_admits_the_longest_cached_prefix_first(tiny_llama_dir, policy):
    # One row: one request at a time, so admission order is the order of first outputs.
    # Step by step: serial loop, so each step's token is visible when step() returns.
    eng = Engine(model=tiny_llama_dir, max_total_tokens=1024, max_running_requests=1,
                 schedule_policy=policy, disable_overlap_schedule=True)
    shared = tokens(40, 20)
    eng.generate(shared + [5], greedy(2))  # now cached
    cold = eng.submit(tokens(30, 21), greedy(), stream=True)
    warm = eng.submit(shared + [6, 7], greedy(), stream=True)
    eng.step()
    first = warm if policy == "lpm" else cold
    other = cold if policy == "lpm" else warm
    assert len(eng.result(first)["output_ids"]) == 1
    assert eng.result(other)["output_ids"] == []
    eng.run_until_done([cold, warm])
    assert eng.result(warm)["meta_info"]["cached_tokens"] == 40
    all_back(eng, 1024)


@pytest.fixture(scope="module")
def plain(tiny_llama_dir):
    # Step by step (test_short_shared_prefix...): serial loop, each step's token visible.
    return Engine(model=tiny_llama_dir, max_total_tokens=2048, disable_radix_cache=True,
                  disable_overlap_schedule=True)


@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
def test_requests_arriving_together_compute_a_shared_prefix_once(tiny_llama_dir, plain, policy):
    eng = Engine(model=tiny_llama_dir, max_total_tokens=2048, max_running_requests=8,
                 schedule_policy=policy, disable_overlap_schedule=True)  # step by step
    shared = tokens(60, 30)
    suffixes = [[10 + i] + tokens(9, 31 + i) for i in range(4)]  # distinct first tokens
    ps = [shared + s for s in suffixes]
    rs = [eng.submit(p, greedy(), stream=True) for p in ps]
    eng.step()
    # The first computes the prefix; the others wait one step for it.
    assert [len(eng.result(r)["output_ids"]) for r in rs] == [1, 0, 0, 0]
    eng.run_until_done(rs)
    got = [eng.pop_result(r) for r in rs]
    cached = [g["meta_info"]["cached_tokens"] for g in got]
    assert sum(c >= 60 for c in cached) >= 3
    computed = sum(g["meta_info"]["prompt_tokens"] - g["meta_info"]["cached_tokens"] for g in got)
    assert computed == len(shared) + sum(len(s) for s in suffixes)
    want = plain.generate(ps, greedy())
    assert [g["output_ids"] for g in got] == [w["output_ids"] for w in want]
    all_back(eng, 2048)
    all_back(plain, 2048)


def test_short_shared_prefix_or_no_cache_admits_together(tiny_llama_dir, plain):
    eng = Engine(model=tiny_llama_dir, max_total_tokens=2048, disable_overlap_schedule=True)
    short = tokens(IN_BATCH_PREFIX_MIN - 2, 40)  # shares < IN_BATCH_PREFIX_MIN uncached tokens
    for e, ps in [(eng, [short + [10 + i] + tokens(5, 41 + i) for i in range(3)]),
                  (plain, [tokens(60, 42) + [10 + i] for i in range(3)])]:
        rs = [e.submit(p, greedy(), stream=True) for p in ps]
        e.step()
        assert [len(e.result(r)["output_ids"]) for r in rs] == [1, 1, 1]
        e.run_until_done(rs)
        for r in rs:
            e.pop_result(r)
        all_back(e, 2048)


def test_new_token_ratio_decays_per_decode_step_and_resets_when_idle(tiny_llama_dir):
    eng = Engine(model=tiny_llama_dir, max_total_tokens=1024, init_new_token_ratio=0.5,
                 min_new_token_ratio=0.2, new_token_ratio_decay=0.1)
    s = eng.scheduler
    assert s.new_token_ratio == 0.5
    rid = eng.submit(tokens(10, 50), greedy(6))
    eng.step()  # extend: no decay
    assert s.new_token_ratio == 0.5
    ratios = []
    for _ in range(4):
        eng.step()
        ratios.append(round(s.new_token_ratio, 6))
    assert ratios == [0.4, 0.3, 0.2, 0.2]  # floored at the minimum
    eng.run_until_done([rid])
    assert s.new_token_ratio == 0.5  # idle again: back to the initial value
    default = Engine(model=tiny_llama_dir, max_total_tokens=256).scheduler
    assert default.new_token_ratio_decay == pytest.approx((0.7 - 0.1) / 600)
    all_back(eng, 1024)


def test_invalid_ratio_flags_are_refused(tiny_llama_dir):
    with pytest.raises(ValueError, match="min_new_token_ratio"):
        Engine(model=tiny_llama_dir, max_total_tokens=256, init_new_token_ratio=0.05)
    with pytest.raises(ValueError, match="decay"):
        Engine(model=tiny_llama_dir, max_total_tokens=256, new_token_ratio_decay=-1.0)
    with pytest.raises(ValueError, match="schedule policy"):
        Engine(model=tiny_llama_dir, max_total_tokens=256, schedule_policy="random")


@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
def test_retraction_resets_the_ratio_and_keeps_outputs_identical(tiny_llama_dir, plain, policy):
    rng = random.Random(11)
    base = tokens(35, 60)
    ps = [(base if i % 2 else []) + tokens(rng.randrange(3, 40), 61 + i) for i in range(6)]
    want = [w["output_ids"] for w in plain.generate(ps, greedy(60))]
    # A low ratio admits boldly, so the small pool runs out during decode.
    eng = Engine(model=tiny_llama_dir, max_total_tokens=200, max_running_requests=8,
                 schedule_policy=policy, init_new_token_ratio=0.3)
    s = eng.scheduler
    rs = [eng.submit(p, greedy(60)) for p in ps]
    resets = 0
    while not all(eng.result(r)["finished"] for r in rs):
        before = s.num_retractions
        eng.step()
        if s.num_retractions > before:
            resets += 1
            assert s.new_token_ratio == 0.3
    assert resets > 0
    assert [eng.pop_result(r)["output_ids"] for r in rs] == want
    all_back(eng, 200)
    all_back(plain, 2048)
