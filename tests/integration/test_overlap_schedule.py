"""The overlap (zero-overhead) scheduler on a tiny random Llama: everything a client sees is
identical with overlap on (the default) and off (--disable-overlap-schedule) -- greedy and
seeded outputs, logprobs, stop conditions, streamed deltas -- across chunked prefill, the
radix cache, mixed chunk, pages, forced retraction and random arrival times; aborts and
retractions leak no slot; the lagging batch really overlaps (future tokens are used)."""

from __future__ import annotations

import random

import pytest

from radixlm import SamplingParams
from radixlm.engine import Engine
from tests.engine_checks import (assert_all_slots_back, mixed_params, random_prompts,
                                 run_staggered)


prompts = random_prompts


def run_both(kw: dict, ps, params, seed: int) -> tuple[Engine, Engine, list, list]:
    serial = Engine(disable_overlap_schedule=True, **kw)
    overlap = Engine(disable_overlap_schedule=False, **kw)
    assert overlap.scheduler.overlap and not serial.scheduler.overlap
    want = run_staggered(serial, ps, params, seed=seed)
    got = run_staggered(overlap, ps, params, seed=seed)
    for eng in (serial, overlap):
        assert_all_slots_back(eng)
        eng.scheduler.shutdown()
    return serial, overlap, want, got


CONFIGS = {
    "plain": dict(max_total_tokens=4096),
    "chunked": dict(max_total_tokens=4096, chunked_prefill_size=16),
    "radix-shared": dict(max_total_tokens=4096, chunked_prefill_size=32),
    "no-radix": dict(max_total_tokens=4096, disable_radix_cache=True),
    "mixed-chunk": dict(max_total_tokens=4096, chunked_prefill_size=16, enable_mixed_chunk=True),
    "pages": dict(max_total_tokens=4096, page_size=4, chunked_prefill_size=24),
    # A pool this small forces decode retraction (checked below).
    "retract": dict(max_total_tokens=300, chunked_prefill_size=16),
    "retract-mixed-pages": dict(max_total_tokens=300, chunked_prefill_size=13, page_size=4,
                                enable_mixed_chunk=True),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_outputs_identical_with_overlap_on_and_off(tiny_llama_dir, name):
    cfg = CONFIGS[name]
    kw = dict(model=tiny_llama_dir, max_running_requests=8, **cfg)
    shared = 40 if name == "radix-shared" else 0
    for seed in range(2):  # random arrival times, different each round
        ps = prompts(10, seed=seed + len(name), shared=shared)
        params = mixed_params(len(ps), seed)
        if "retract" in name:
            params = [SamplingParams(max_new_tokens=60, temperature=p.temperature, seed=p.seed,
                                     ignore_eos=True) for p in params]
        serial, overlap, want, got = run_both(kw, ps, params, seed)
        assert got == want
        if "retract" in name:
            assert serial.scheduler.num_retractions > 0
            assert overlap.scheduler.num_retractions > 0


def collect(engine: Engine, ps, params) -> tuple[list[dict], dict[str, list[int]]]:
    """Run to completion; return the results and every streamed token delta per request."""
    rids = [engine.submit(p, sp, stream=True) for p, sp in zip(ps, params)]
    streamed: dict[str, list[int]] = {r: [] for r in rids}
    while not all(engine.result(r)["finished"] for r in rids):
        for out in engine.step():
            streamed[out.rid] += out.token_ids_delta
    engine.settle()
    return [engine.pop_result(r) for r in rids], streamed


def test_stop_conditions_hit_the_same_token_and_no_extra_token_is_streamed(tiny_llama_dir):
    ps = prompts(6, seed=7)
    serial = Engine(model=tiny_llama_dir, max_total_tokens=4096, disable_overlap_schedule=True)
    overlap = Engine(model=tiny_llama_dir, max_total_tokens=4096, disable_overlap_schedule=False)
    first = [SamplingParams(max_new_tokens=30, temperature=0.0, ignore_eos=True)] * len(ps)
    base, _ = collect(serial, ps, first)
    # The same history on both engines, so their radix caches (cached_tokens) agree too.
    assert [r["output_ids"] for r in collect(overlap, ps, first)[0]] == \
        [r["output_ids"] for r in base]
    # Stop at a token each request really produces, at different depths; and max_tokens.
    params = []
    for i, r in enumerate(base):
        ids = r["output_ids"]
        if i % 2:
            params.append(SamplingParams(max_new_tokens=30, temperature=0.0, ignore_eos=True,
                                         stop_token_ids=[ids[3 + i]]))
        else:
            params.append(SamplingParams(max_new_tokens=2 + i, temperature=0.0, ignore_eos=True))
    want, want_stream = collect(serial, ps, params)
    got, got_stream = collect(overlap, ps, params)
    for w, g in zip(want, got):
        assert g["output_ids"] == w["output_ids"]
        assert g["meta_info"] == w["meta_info"]
    for rid_w, rid_g in zip(want_stream, got_stream):
        # The client sees exactly the final tokens, nothing after the stop.
        assert got_stream[rid_g] == want_stream[rid_w]
    for g, p in zip(got, params):
        assert len(g["output_ids"]) == g["meta_info"]["completion_tokens"]
        if p.stop_token_ids:
            assert g["output_ids"][-1] == p.stop_token_ids[0]
    for eng in (serial, overlap):
        assert_all_slots_back(eng)


def test_future_tokens_are_used_and_the_bubble_is_measured(tiny_llama_dir):
    eng = Engine(model=tiny_llama_dir, max_total_tokens=4096, disable_overlap_schedule=False)
    futures = []
    forward = eng.scheduler.runner.forward

    decodes = []

    def spy(fb):
        futures.append(fb.future_token_idx is not None)
        decodes.append(fb.forward_mode.is_decode())
        return forward(fb)

    eng.scheduler.runner.forward = spy
    out = eng.generate(prompts(4, seed=1), SamplingParams(max_new_tokens=8, temperature=0.0,
                                                          ignore_eos=True))
    assert all(len(o["output_ids"]) == 8 for o in out)
    # Every decode was built before the previous batch's tokens were processed.
    assert sum(futures) >= 7
    t = eng.scheduler.worker.timer
    assert t.forwards == len(futures)
    assert t.decode_forwards == sum(decodes) >= 7 and 0 < t.decode_forward_s < t.forward_s
    assert t.forward_s > 0 and t.schedule_s > 0 and 0.0 <= t.bubble_share < 1.0
    assert_all_slots_back(eng)


def test_aborts_mid_flight_leak_nothing(tiny_llama_dir):
    eng = Engine(model=tiny_llama_dir, max_total_tokens=400, chunked_prefill_size=16,
                 max_running_requests=6, disable_overlap_schedule=False)
    rng = random.Random(3)
    ps = prompts(14, seed=3, lo=20, hi=70)
    rids = []
    for p in ps:
        rids.append(eng.submit(p, SamplingParams(max_new_tokens=50, temperature=0.0,
                                                 ignore_eos=True)))
        for _ in range(rng.randrange(0, 3)):
            eng.step()
            eng.check_invariant()
        if rng.random() < 0.5:  # abort a random live request: waiting, mid-chunk or running
            live = [r for r in rids if not eng.result(r)["finished"]]
            eng.abort(rng.choice(live))
    while not all(eng.result(r)["finished"] for r in rids):
        eng.step()
        eng.check_invariant()
    eng.settle()
    reasons = {eng.result(r)["meta_info"]["finish_reason"] for r in rids}
    assert "abort" in reasons and "length" in reasons
    assert eng.scheduler.num_retractions > 0
    assert_all_slots_back(eng)
