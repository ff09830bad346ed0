"""PrefillAdder budget arithmetic: rows, prefill tokens, chunk truncation, KV with the
new-token ratio. Hand-built Req objects, no model."""

from __future__ import annotations

import pytest

from radixlm.sampling_params import SamplingParams
from radixlm.scheduler.prefill_adder import CLIP_MAX_NEW_TOKENS, PrefillAdder, expected_growth
from radixlm.scheduler.req import Req


def req(prompt_len: int, max_new: int = 10, out: int = 0, kv_len: int = 0,
        row: int | None = None) -> Req:
    r = Req(rid=f"r{prompt_len}-{max_new}", input_ids=list(range(3, 3 + prompt_len)),
            sampling_params=SamplingParams(max_new_tokens=max_new))
    r.output_ids = [7] * out
    r.kv_len = kv_len
    r.req_pool_idx = row
    return r


def adder(kv=1000, rows=8, budget=100, chunking=True, running=(), ratio=1.0) -> PrefillAdder:
    return PrefillAdder(free_kv_slots=kv, free_rows=rows, prefill_budget=budget,
                        chunking=chunking, running=list(running), new_token_ratio=ratio)


@pytest.mark.parametrize("remaining,ratio,want", [
    (10, 1.0, 10), (10, 0.7, 7), (10, 0.15, 2), (10, 0.0, 0), (1, 0.1, 1), (0, 0.7, 0),
    (60, 0.7, 42), (90, 0.7, 63), (3, 0.5, 2),
])
def test_expected_growth_is_ceil_of_remaining_times_ratio(remaining, ratio, want):
    assert expected_growth(req(5, max_new=remaining), ratio) == want


def test_expected_growth_counts_generated_tokens_and_clips_huge_budgets():
    assert expected_growth(req(5, max_new=20, out=15), 0.5) == 3  # ceil(5 * 0.5)
    assert expected_growth(req(5, max_new=10 ** 6), 0.5) == CLIP_MAX_NEW_TOKENS // 2
    assert expected_growth(req(5, max_new=10 ** 6), 1.0) == CLIP_MAX_NEW_TOKENS


def test_running_requests_reserve_their_growth_with_the_ratio():
    running = [req(20, max_new=100, out=40, kv_len=59), req(5, max_new=10, out=9, kv_len=13)]
    a = adder(kv=500, running=running, ratio=0.5)
    assert a.kv_budget == 500 - 30 - 1  # ceil(60 * .5), ceil(1 * .5)
    assert adder(kv=500, running=running, ratio=1.0).kv_budget == 500 - 60 - 1


def test_candidate_needs_extend_plus_growth():
    a = adder(kv=100, budget=200, chunking=False, ratio=0.5)
    assert not a.try_add(req(61, max_new=80))  # 61 + 40 > 100
    a = adder(kv=100, budget=200, chunking=False, ratio=0.5)
    r = req(60, max_new=80)
    assert a.try_add(r)  # 60 + 40 == 100
    assert (r.extend_input_len, a.kv_budget, a.prefill_tokens, a.new_rows) == (60, 0, 60, 1)


def admitted_count(a: PrefillAdder, n: int, prompt_len: int, max_new: int) -> int:
    count = 0
    while count < n and a.try_add(req(prompt_len, max_new=max_new)):
        count += 1
    return count


def test_lower_ratio_admits_more():
    # Each candidate needs 20 + ceil(100 * ratio) slots out of 300.
    assert admitted_count(adder(kv=300, budget=1000, chunking=False, ratio=0.7), 6, 20, 100) == 3
    assert admitted_count(adder(kv=300, budget=1000, chunking=False, ratio=0.1), 6, 20, 100) == 6
    assert admitted_count(adder(kv=300, budget=1000, chunking=False, ratio=1.0), 6, 20, 100) == 2


def test_prefill_budget_truncates_the_last_request_into_a_chunk():
    a = adder(kv=1000, budget=50, ratio=0.5)
    r1, r2, r3 = req(30, max_new=10), req(40, max_new=10), req(5)
    assert a.try_add(r1) and a.try_add(r2)
    assert r1.extend_input_len == 30 and r2.extend_input_len == 20  # 50 - 30 left
    # r2 is a chunk (not its last): no growth reserved for it yet.
    assert a.kv_budget == 1000 - (30 + 5) - 20
    assert not a.try_add(r3)  # no prefill budget left: the scan stops
    assert a.admitted == [r1, r2]


def test_without_chunking_a_lone_request_may_exceed_the_prefill_budget():
    a = adder(kv=1000, budget=50, chunking=False)
    big = req(80, max_new=10)
    assert a.try_add(big) and big.extend_input_len == 80
    assert not a.try_add(req(3))  # budget spent
    a = adder(kv=1000, budget=50, chunking=False)
    assert a.try_add(req(10))
    assert not a.try_add(req(80))  # not alone: must wait


def test_kv_budget_truncates_a_prompt_into_a_chunk_when_chunking():
    a = adder(kv=40, budget=100, ratio=1.0)
    r = req(60, max_new=10)
    assert a.try_add(r)
    assert r.extend_input_len == 40 and a.kv_budget == 0  # a chunk: no growth reserve
    # The whole prompt fits but not its growth: it would be its last chunk, so it waits
    # (decode frees or finishes something first) rather than being admitted.
    a = adder(kv=65, budget=100, ratio=1.0)
    assert not a.try_add(req(60, max_new=10))
    assert adder(kv=65, budget=100, ratio=0.5).try_add(req(60, max_new=10))  # 60 + 5


def test_continuing_chunk_needs_no_row_and_counts_its_cached_part():
    r = req(100, max_new=20, kv_len=64, row=3)  # 64 tokens done in earlier chunks
    a = adder(kv=200, rows=0, budget=64, ratio=0.5)
    assert a.try_add(r)
    assert r.extend_input_len == 36 and a.new_rows == 0
    assert a.kv_budget == 200 - 36 - 10
    assert not a.try_add(req(5))  # no free row for a new request


def test_rows_limit_admissions():
    a = adder(rows=2)
    assert a.try_add(req(3)) and a.try_add(req(4))
    assert not a.try_add(req(5))
    assert a.new_rows == 2


def test_lone_request_always_fits_an_empty_pool():
    # add_request guarantees prompt + max_new <= pool size; with ratio <= 1 it fits alone.
    for ratio in (0.1, 0.7, 1.0):
        for chunking in (True, False):
            a = adder(kv=100, budget=1000, chunking=chunking, ratio=ratio)
            r = req(40, max_new=60)
            assert a.try_add(r) and r.extend_input_len == 40
