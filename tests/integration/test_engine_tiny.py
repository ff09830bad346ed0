"""The offline Engine on a tiny random Llama: batching, sampling, stopping, retraction."""

import random

import pytest

from radixlm import SamplingParams
from radixlm.engine import Engine
from tests.engine_checks import assert_all_slots_back


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    eng = Engine(model=tiny_llama_dir, max_total_tokens=2048, max_running_requests=8,
                 max_prefill_tokens=256)
    yield eng
    eng.check_invariant()


@pytest.fixture(autouse=True)
def pool_invariant(engine):
    yield
    assert not engine.scheduler.has_work()
    engine.check_invariant()
    assert_all_slots_back(engine, 2048)


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 256) for _ in range(rng.randrange(3, 40))] for _ in range(n)]


def greedy(max_new=12, **kw):
    return SamplingParams(max_new_tokens=max_new, temperature=0.0, ignore_eos=True, **kw)


def test_greedy_alone_equals_in_batch_with_staggered_arrivals(engine):
    ps = prompts(6)
    alone = [engine.generate(p, greedy())["output_ids"] for p in ps]
    # Arrive one by one, a few steps apart, so requests join a running decode batch.
    rids = []
    for p in ps:
        rids.append(engine.submit(p, greedy()))
        for _ in range(random.Random(len(p)).randrange(0, 4)):
            engine.step()
    engine.run_until_done(rids)
    together = [engine.pop_result(r)["output_ids"] for r in rids]
    assert together == alone


def test_max_new_tokens_and_usage(engine):
    out = engine.generate(prompts(1)[0], greedy(max_new=7))
    assert len(out["output_ids"]) == 7
    assert out["meta_info"]["finish_reason"] == "length"
    assert out["meta_info"]["completion_tokens"] == 7


def test_top_k_1_equals_greedy_and_seed_reproduces(engine):
    p = prompts(1, seed=3)[0]
    g = engine.generate(p, greedy())["output_ids"]
    k1 = engine.generate(p, SamplingParams(max_new_tokens=12, temperature=1.3, top_k=1, ignore_eos=True))
    assert k1["output_ids"] == g
    s = SamplingParams(max_new_tokens=12, temperature=1.0, seed=1234, ignore_eos=True)
    a = engine.generate(p, s)["output_ids"]
    b = engine.generate([p, prompts(1, seed=9)[0]], [s, s])[0]["output_ids"]
    assert a == b


def test_stop_token_ids_end_generation_at_that_token(engine):
    p = prompts(1, seed=5)[0]
    full = engine.generate(p, greedy(max_new=10))["output_ids"]
    target = full[4]
    out = engine.generate(p, greedy(max_new=10, stop_token_ids=[target]))
    first = full.index(target)
    assert out["output_ids"] == full[:first + 1]
    assert out["meta_info"]["finish_reason"] == "stop"
    assert out["meta_info"]["matched_stop"] == target


def test_stop_string_is_excluded_from_text(engine):
    p = prompts(1, seed=6)[0]
    full = engine.generate(p, greedy(max_new=10))
    words = full["text"].split()
    stop = words[5]
    out = engine.generate(p, greedy(max_new=10, stop=[stop]))
    cut = full["text"].index(stop)
    assert out["text"] == full["text"][:cut]
    assert out["meta_info"]["finish_reason"] == "stop"
    assert out["meta_info"]["matched_stop"] == stop


def test_abort_frees_everything(engine):
    rids = [engine.submit(p, greedy(max_new=50)) for p in prompts(4, seed=7)]
    engine.step()
    engine.step()
    engine.abort(rids[0])
    engine.abort(rids[3])
    engine.run_until_done(rids)
    reasons = [engine.pop_result(r)["meta_info"]["finish_reason"] for r in rids]
    assert reasons == ["abort", "length", "length", "abort"]


def test_oversized_request_is_rejected_with_a_reason(engine):
    out = engine.generate([5] * 10, greedy(max_new=5000))
    assert out["meta_info"]["finish_reason"] == "abort"
    assert "at most" in out["meta_info"]["error"]


def test_retraction_keeps_outputs_identical(tiny_llama_dir):
    ps = prompts(6, seed=11)
    big = Engine(model=tiny_llama_dir, max_total_tokens=4096, max_running_requests=8)
    expected = [o["output_ids"] for o in big.generate(ps, greedy(max_new=60))]
    small = Engine(model=tiny_llama_dir, max_total_tokens=200, max_running_requests=8)
    got = [o["output_ids"] for o in small.generate(ps, greedy(max_new=60))]
    assert small.scheduler.num_retractions > 0
    assert got == expected
    small.check_invariant()
    assert_all_slots_back(small, 200)


def test_shared_prefix_is_served_from_the_radix_cache(engine, tiny_llama_dir):
    shared = prompts(1, seed=21)[0] + prompts(1, seed=22)[0]
    a, b = shared + [7, 8, 9], shared + [10, 11]
    first = engine.generate(a, greedy())
    second = engine.generate(b, greedy())
    assert second["meta_info"]["cached_tokens"] >= len(shared)
    again = engine.generate(a, greedy())
    assert again["meta_info"]["cached_tokens"] == len(a) - 1  # the last token is recomputed
    assert again["output_ids"] == first["output_ids"]
    plain = Engine(model=tiny_llama_dir, max_total_tokens=2048, disable_radix_cache=True)
    ref = plain.generate([a, b], greedy())
    assert [first["output_ids"], second["output_ids"]] == [r["output_ids"] for r in ref]
    assert all(r["meta_info"]["cached_tokens"] == 0 for r in ref)
    plain.check_invariant()
    assert plain.scheduler.runner.allocator.available_size() == 2048


def test_same_batch_requests_and_eviction_under_pressure(tiny_llama_dir):
    eng = Engine(model=tiny_llama_dir, max_total_tokens=300, max_running_requests=4)
    base = prompts(1, seed=30)[0]
    ps = [base + p for p in prompts(12, seed=31)]
    expected = [eng.generate(p, greedy(max_new=20))["output_ids"] for p in ps[:2]]
    got = eng.generate(ps, greedy(max_new=20))
    assert [g["output_ids"] for g in got[:2]] == expected
    eng.check_invariant()
    assert_all_slots_back(eng, 300)


def test_flush_cache_refused_while_busy_then_empties_the_cache(engine):
    engine.generate(prompts(2, seed=40), greedy())
    assert engine.scheduler.tree_cache.total_size() > 0
    rid = engine.submit(prompts(1, seed=41)[0], greedy(max_new=20))
    engine.step()
    refused = engine.scheduler.flush_cache()
    assert not refused.success and "running" in refused.message
    engine.run_until_done([rid])
    engine.pop_result(rid)
    ok = engine.scheduler.flush_cache()
    assert ok.success
    assert engine.scheduler.tree_cache.total_size() == 0
    assert engine.scheduler.runner.allocator.available_size() == 2048


def test_idle_scheduler_releases_the_free_heap_once_after_work(engine, monkeypatch):
    """on_idle (the serving loop calls it after a poll period without work) gives the
    heap back once per burst of batches, never while there is work."""
    import radixlm.scheduler.scheduler as sched_mod

    calls = []
    monkeypatch.setattr(sched_mod, "release_free_heap", lambda: calls.append(1) or True)
    sched = engine.scheduler
    engine.generate(prompts(2, seed=9), greedy(4))
    sched.on_idle()
    sched.on_idle()  # nothing ran since: no second release
    assert len(calls) == 1
    rid = engine.submit(prompts(1, seed=10)[0], greedy(3))
    sched.on_idle()  # waiting work: not idle
    assert len(calls) == 1
    while not engine.result(rid)["finished"]:
        engine.step()
    engine.pop_result(rid)
    sched.on_idle()
    assert len(calls) == 2
