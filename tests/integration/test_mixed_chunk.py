"""--enable-mixed-chunk on a tiny random Llama: running decodes ride along in prefill
batches (ForwardMode.MIXED); greedy outputs are identical with it on and off (staggered
arrivals, chunked prefill, retraction, pages); decodes flow during a chunked prefill
without alternating steps; the pool invariant holds after every step."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from radixlm import SamplingParams
from radixlm.engine import Engine
from radixlm.forward_batch import ForwardMode
from tests.engine_checks import assert_all_slots_back as all_back, run_staggered


def prompts(n: int, seed: int, lo: int = 10, hi: int = 80) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 256) for _ in range(rng.randrange(lo, hi))] for _ in range(n)]


def greedy(max_new: int = 20) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new, temperature=0.0, ignore_eos=True)


def count_modes(engine: Engine) -> Counter:
    """Record the ForwardMode of every forward the engine's runner runs."""
    modes: Counter = Counter()
    runner = engine.scheduler.runner
    forward = runner.forward

    def spy(fb):
        modes[fb.forward_mode] += 1
        if fb.forward_mode is ForwardMode.MIXED:
            # The running decodes are one-token extends after the prefills.
            assert fb.extend_seq_lens_cpu[-1] == 1
        return forward(fb)

    runner.forward = spy
    return modes


@pytest.mark.parametrize("chunk,total,page", [(16, 4096, 1), (7, 260, 1), (13, 260, 4),
                                              (-1, 4096, 1)])
def test_outputs_identical_with_mixed_chunk_on_and_off(tiny_llama_dir, chunk, total, page):
    ps = prompts(12, seed=chunk + total, lo=20, hi=80)
    max_new = [random.Random(i).randrange(30, 70) for i in range(len(ps))]
    params = [greedy(m) for m in max_new]
    kw = dict(model=tiny_llama_dir, max_total_tokens=total, chunked_prefill_size=chunk,
              page_size=page, max_running_requests=6)
    off = Engine(**kw)
    want = run_staggered(off, ps, params, seed=1)
    on = Engine(enable_mixed_chunk=True, **kw)
    modes = count_modes(on)
    assert run_staggered(on, ps, params, seed=1) == want
    assert modes[ForwardMode.MIXED] > 0
    if total < 1000:
        assert off.scheduler.num_retractions > 0 and on.scheduler.num_retractions > 0
    all_back(off)
    all_back(on)


def test_seeded_sampling_identical_with_mixed_chunk(tiny_llama_dir):
    ps = prompts(5, seed=3)
    params = [SamplingParams(max_new_tokens=15, temperature=0.9, seed=i, ignore_eos=True)
              for i in range(len(ps))]
    kw = dict(model=tiny_llama_dir, max_total_tokens=2048, chunked_prefill_size=9)
    want = run_staggered(Engine(**kw), ps, params, seed=2)
    on = Engine(enable_mixed_chunk=True, **kw)
    assert run_staggered(on, ps, params, seed=2) == want
    all_back(on)


def test_decodes_ride_along_every_chunk(tiny_llama_dir):
    # Step by step: serial loop, so each step's token is visible when step() returns.
    eng = Engine(model=tiny_llama_dir, max_total_tokens=4096, chunked_prefill_size=8,
                 enable_mixed_chunk=True, disable_overlap_schedule=True)
    modes = count_modes(eng)
    short = eng.submit([5, 6, 7], greedy(max_new=40), stream=True)
    eng.step()
    assert len(eng.result(short)["output_ids"]) == 1
    long = eng.submit(list(range(3, 83)), greedy(max_new=5), stream=True)  # 80 tokens
    steps = grew = 0
    while not eng.result(long)["output_ids"]:
        before = len(eng.result(short)["output_ids"])
        eng.step()
        eng.check_invariant()
        steps += 1
        grew += len(eng.result(short)["output_ids"]) > before
    # Every step is a mixed chunk: 7 prompt tokens + 1 decode each (the decode takes one
    # token of the chunk budget), and the short request grows in every one of them.
    assert grew == steps == 12  # ceil(80 / 7)
    assert modes[ForwardMode.DECODE] == 0 and modes[ForwardMode.MIXED] == steps
    eng.run_until_done([short, long])
    all_back(eng)


def test_abort_of_a_running_request_during_mixed_chunks(tiny_llama_dir):
    eng = Engine(model=tiny_llama_dir, max_total_tokens=4096, chunked_prefill_size=8,
                 enable_mixed_chunk=True)
    a = eng.submit([5, 6, 7], greedy(max_new=40))
    b = eng.submit([8, 9], greedy(max_new=40))
    eng.step()
    long = eng.submit(list(range(3, 60)), greedy(max_new=5))
    eng.step()
    eng.abort(a)
    eng.step()
    eng.abort(long)  # mid-prefill, waiting between chunks
    eng.run_until_done([a, b, long])
    reasons = [eng.result(r)["meta_info"]["finish_reason"] for r in (a, b, long)]
    assert reasons == ["abort", "length", "abort"]
    all_back(eng)


def test_cache_hit_rate_in_pool_stats(tiny_llama_dir):
    eng = Engine(model=tiny_llama_dir, max_total_tokens=2048, enable_mixed_chunk=True)
    stats = eng.scheduler.pool_stats("s")
    assert stats.prompt_tokens_total == stats.cached_tokens_total == 0
    assert stats.cache_hit_rate == 0.0
    p = prompts(1, seed=9, lo=30, hi=31)[0]
    first = eng.generate(p, greedy(5))
    second = eng.generate(p, greedy(5))
    assert first["meta_info"]["cached_tokens"] == 0
    assert second["meta_info"]["cached_tokens"] == 29  # all but the last prompt token
    stats = eng.scheduler.pool_stats("s")
    assert stats.prompt_tokens_total == 60 and stats.cached_tokens_total == 29
    assert stats.cache_hit_rate == pytest.approx(29 / 60)
    assert stats.invariant_error is None


def test_cached_tokens_reach_the_server_usage(tiny_llama_dir):
    """The scheduler's cached_tokens travel through the detokenizer's ReqStrOut into the
    server's aggregation: /generate's meta_info (ChoiceResult) and OpenAI usage
    (UsageCounter -> prompt_tokens_details.cached_tokens)."""
    from radixlm.server.outputs import ChoiceResult, UsageCounter

    eng = Engine(model=tiny_llama_dir, max_total_tokens=2048, page_size=4)
    p = prompts(1, seed=11, lo=30, hi=31)[0]
    eng.generate(p, greedy(5))
    rid = eng.submit(p, greedy(5), stream=True)
    result = ChoiceResult()
    while not eng.result(rid)["finished"]:
        for out in eng.step():
            if out.rid == rid:
                result.add(out)
    assert result.cached_tokens == 28  # 29 matchable tokens, cut to whole pages of 4
    usage = UsageCounter()
    usage.add(0, 0, result.prompt_tokens, result.cached_tokens, result.completion_tokens)
    assert usage.to_dict()["prompt_tokens_details"] == {"cached_tokens": 28}
    assert eng.scheduler.pool_stats("s").cached_tokens_total == 28
    all_back(eng)
