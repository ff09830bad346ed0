"""--enable-deterministic-inference through the offline Engine: one prompt's tokens and
logprobs (chosen + top-5, compared as exact floats) must be identical whatever shares its
batch, however its prefill is chunked, whether its prefix comes from the radix cache, and
whichever scheduler loop runs it; greedy and seeded sampling alike."""

from __future__ import annotations

import dataclasses
import random

import pytest

from radixlm import Engine, SamplingParams
from tests.conftest import requires_default_model
from tests.engine_checks import assert_all_slots_back, run_staggered

GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0, logprobs=True, top_logprobs=5,
                        ignore_eos=True)
SEEDED = SamplingParams(max_new_tokens=8, temperature=0.9, top_p=0.9, seed=1234,
                        logprobs=True, top_logprobs=5, ignore_eos=True)


def _signature(result: dict) -> tuple:
    lps = tuple((lp.token_id, lp.logprob, tuple(lp.top)) for lp in result["logprobs"])
    return tuple(result["output_ids"]), lps


def _run_at_once(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> list[tuple]:
    rids = [engine.submit(p, params) for p in prompts]
    engine.run_until_done(rids)
    return [_signature(engine.pop_result(r)) for r in rids]


def _flush(engine: Engine) -> None:
    assert engine.scheduler.flush_cache().success


def _prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 256) for _ in range(n)]


def _signatures(engine: Engine, params: SamplingParams, seed: int = 0) -> list[tuple]:
    """The prompt P run alone, 2-5 copies at once, mixed with others (at once and
    staggered), and after its prefixes of several lengths were cached."""
    rng = random.Random(seed)
    p = _prompt(rng, 45)
    others = [_prompt(rng, rng.randrange(3, 70)) for _ in range(8)]
    sigs = []
    _flush(engine)
    sigs += _run_at_once(engine, [p], params)
    for k in (2, 3, 5):
        _flush(engine)
        sigs += _run_at_once(engine, [p] * k, params)
    _flush(engine)
    mixed = others[:4] + [p] + others[4:]
    sigs.append(_run_at_once(engine, mixed, params)[4])
    _flush(engine)
    out = run_staggered(engine, mixed, params, seed=seed)
    assert out[4] == list(sigs[0][0])
    sigs.append(_run_at_once(engine, [p], params)[0])  # warm: all but the last token cached
    for shared in (9, 24, 40):
        _flush(engine)
        _run_at_once(engine, [p[:shared] + _prompt(rng, 5)], params)
        sigs.append(_run_at_once(engine, [p], params)[0])
    assert_all_slots_back(engine)
    return sigs


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_one_output_whatever_the_batch_chunks_and_cache(tiny_llama_dir: str,
                                                        params: SamplingParams) -> None:
    configs = [dict(chunked_prefill_size=1024),
               dict(chunked_prefill_size=7, max_prefill_tokens=7),
               dict(chunked_prefill_size=16, enable_mixed_chunk=True),
               dict(chunked_prefill_size=16, disable_overlap_schedule=True, page_size=4)]
    sigs = []
    for cfg in configs:
        engine = Engine(tiny_llama_dir, enable_deterministic_inference=True,
                        max_total_tokens=4096, max_running_requests=16, **cfg)
        sigs += _signatures(engine, params)
        engine.shutdown()
    assert len(set(sigs)) == 1, f"{len(set(sigs))} different outputs over {len(sigs)} runs"


def test_seed_changes_the_draw(tiny_llama_dir: str) -> None:
    engine = Engine(tiny_llama_dir, enable_deterministic_inference=True, max_total_tokens=2048)
    p = _prompt(random.Random(3), 20)
    outs = set()
    for seed in range(4):
        params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=seed, ignore_eos=True)
        outs.add(tuple(engine.generate(p, params)["output_ids"]))
    assert len(outs) > 1


@pytest.mark.slow
@requires_default_model
def test_default_model_batch_and_cache_invariant() -> None:
    engine = Engine(enable_deterministic_inference=True, max_total_tokens=2048,
                    max_running_requests=8)
    tok = engine.tokenizer
    p = tok.encode("The three primary colors are")
    others = [tok.encode(t) for t in ("Hi", "Write a haiku about the sea, please.",
                                      "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16")]
    for params in (GREEDY, SEEDED):
        params = dataclasses.replace(params, max_new_tokens=4)
        _flush(engine)
        alone = _run_at_once(engine, [p], params)[0]
        mixed = _run_at_once(engine, [others[0], p, *others[1:]], params)[1]  # p warm now
        _flush(engine)
        batched = _run_at_once(engine, [*others, p, p], params)[-2:]
        assert {alone, mixed, *batched} == {alone}
    assert_all_slots_back(engine)
