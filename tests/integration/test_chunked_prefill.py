"""Chunked prefill on a tiny random Llama: same outputs, decodes keep flowing, no leaks."""

import random

import pytest

from radixlm import SamplingParams
from radixlm.engine import Engine
from tests.engine_checks import assert_all_slots_back as all_back


def long_prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 256) for _ in range(rng.randrange(30, 90))] for _ in range(n)]


def greedy(max_new=10):
    return SamplingParams(max_new_tokens=max_new, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    return Engine(model=tiny_llama_dir, max_total_tokens=4096, chunked_prefill_size=-1,
                  disable_radix_cache=True)


@pytest.mark.parametrize("chunk", [7, 16, 64])
def test_chunked_outputs_equal_unchunked(tiny_llama_dir, reference, chunk):
    ps = long_prompts(5, seed=chunk)
    want = [o["output_ids"] for o in reference.generate(ps, greedy())]
    eng = Engine(model=tiny_llama_dir, max_total_tokens=4096, chunked_prefill_size=chunk)
    assert [o["output_ids"] for o in eng.generate(ps, greedy())] == want
    seeded = SamplingParams(max_new_tokens=10, temperature=1.0, seed=5, ignore_eos=True)
    assert eng.generate(ps[0], seeded)["output_ids"] == reference.generate(ps[0], seeded)["output_ids"]
    all_back(eng, 4096)


def test_decodes_keep_flowing_between_chunks(tiny_llama_dir):
    # Step by step: serial loop, so each step's token is visible when step() returns.
    eng = Engine(model=tiny_llama_dir, max_total_tokens=4096, chunked_prefill_size=8,
                 disable_overlap_schedule=True)
    short = eng.submit([5, 6, 7], greedy(max_new=40), stream=True)
    eng.step()
    assert len(eng.result(short)["output_ids"]) == 1
    long = eng.submit(list(range(3, 83)), greedy(max_new=5), stream=True)  # 10 chunks
    grew_during_prefill = 0
    while not eng.result(long)["output_ids"]:
        before = len(eng.result(short)["output_ids"])
        eng.step()
        grew_during_prefill += len(eng.result(short)["output_ids"]) > before
    assert grew_during_prefill >= 8  # a decode step between consecutive chunks
    eng.run_until_done([short, long])
    all_back(eng, 4096)


def test_abort_mid_prefill_frees_everything(tiny_llama_dir):
    eng = Engine(model=tiny_llama_dir, max_total_tokens=4096, chunked_prefill_size=8)
    rid = eng.submit(list(range(3, 83)), greedy(), stream=True)
    eng.step()
    eng.step()
    assert eng.result(rid)["output_ids"] == []  # nothing before the last chunk
    eng.abort(rid)
    eng.run_until_done([rid])
    assert eng.result(rid)["meta_info"]["finish_reason"] == "abort"
    all_back(eng, 4096)


def test_small_pool_with_chunks_and_retraction(tiny_llama_dir, reference):
    ps = long_prompts(6, seed=99)
    want = [o["output_ids"] for o in reference.generate(ps, greedy(max_new=40))]
    eng = Engine(model=tiny_llama_dir, max_total_tokens=260, chunked_prefill_size=16)
    assert [o["output_ids"] for o in eng.generate(ps, greedy(max_new=40))] == want
    assert eng.scheduler.num_retractions > 0
    all_back(eng, 260)
