"""STANDALONE speculative decoding (radixlm/speculative/draft_model.py) on tiny random Llamas.

The target is tests/conftest.py's tiny Llama; the draft is the same checkpoint with noise
added to its output head (so it agrees with the target part of the time) or the target
itself (it must agree nearly always). Greedy outputs must equal the target's without
speculation; sampled first three tokens must follow the target's exact law (the
chi-square test of test_speculative_sampling.py with a model drafter, whose draft
distributions enter min(1, p/q)); after finishes and aborts both pools hold nothing
(the target's pool invariant, the draft pool's own check); a draft model with another
vocabulary is refused at start.
"""

from __future__ import annotations

import pytest
import torch

from radixlm import SamplingParams
from radixlm.engine import Engine
from radixlm.speculative.draft_model import DraftVocabError
from tests.conftest import make_tiny_llama, make_tiny_tokenizer_files
from tests.engine_checks import assert_all_slots_back
from tests.integration.test_speculative_sampling import (PROMPT, TOP_K, _exact, chi2_critical,
                                                        chi_square)

PROMPTS = [[1, 17, 42, 99, 5], [1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [1, 200, 201, 7]]
MAX_NEW = 24


@pytest.fixture(scope="module")
def noisy_draft_dir(tiny_llama_dir, tmp_path_factory) -> str:
    """The target with noise on its output head: same tokenizer, a different law."""
    from transformers import LlamaForCausalLM
    path = str(tmp_path_factory.mktemp("tiny_draft"))
    model = LlamaForCausalLM.from_pretrained(tiny_llama_dir, torch_dtype=torch.float32)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        w = model.lm_head.weight
        w.add_(torch.randn(w.shape, generator=gen) * w.std() * 0.6)
    model.save_pretrained(path, safe_serialization=True)
    make_tiny_tokenizer_files(path, model.config.vocab_size)
    return path


def engine(target: str, draft: str | None = None, **kw) -> Engine:
    spec = {} if draft is None else dict(speculative_algorithm="STANDALONE",
                                         speculative_draft_model_path=draft,
                                         speculative_num_steps=3)
    kw.setdefault("max_total_tokens", 2048)
    return Engine(model=target, dtype="float32", device="cpu", **spec, **kw)


def greedy(n: int = MAX_NEW, **kw) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True, **kw)


def assert_draft_pool_empty(eng: Engine) -> None:
    drafter = eng.scheduler.speculative.drafter
    drafter.check(set())
    assert drafter.allocator.available_size() == drafter.allocator.size
    assert drafter.req_to_token_pool.available_size() == drafter.req_to_token_pool.size


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    eng = engine(tiny_llama_dir)
    return [o["output_ids"] for o in eng.generate(PROMPTS, greedy())]


@pytest.mark.parametrize("overlap", [False, True])
def test_greedy_equals_no_speculation(tiny_llama_dir, noisy_draft_dir, reference, overlap):
    eng = engine(tiny_llama_dir, noisy_draft_dir, disable_overlap_schedule=not overlap)
    assert [o["output_ids"] for o in eng.generate(PROMPTS, greedy())] == reference
    for p, want in zip(PROMPTS, reference):  # one at a time: every step verifies
        assert eng.generate(p, greedy())["output_ids"] == want
    stats = eng.scheduler.speculative.stats
    assert stats.drafted > 0 and 0 < stats.accepted < stats.drafted, stats.as_dict()
    assert_all_slots_back(eng, 2048)
    assert_draft_pool_empty(eng)


def test_self_draft_accepts_nearly_everything(tiny_llama_dir, reference):
    eng = engine(tiny_llama_dir, tiny_llama_dir)
    assert [o["output_ids"] for o in eng.generate(PROMPTS, greedy())] == reference
    stats = eng.scheduler.speculative.stats
    assert stats.drafted > 20 and stats.accepted >= 0.95 * stats.drafted, stats.as_dict()
    assert_all_slots_back(eng, 2048)
    assert_draft_pool_empty(eng)


def test_logprobs_equal_the_targets(tiny_llama_dir, noisy_draft_dir):
    params = greedy(12, logprobs=True, top_logprobs=2)
    want = engine(tiny_llama_dir).generate(PROMPTS, params)
    eng = engine(tiny_llama_dir, noisy_draft_dir)
    got = eng.generate(PROMPTS, params)
    for g, w in zip(got, want):
        assert g["output_ids"] == w["output_ids"]
        assert [lp.token_id for lp in g["logprobs"]] == w["output_ids"]
        for a, b in zip(g["logprobs"], w["logprobs"]):
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
    assert eng.scheduler.speculative.stats.accepted > 0


def test_abort_and_finish_free_both_pools(tiny_llama_dir, noisy_draft_dir, reference):
    eng = engine(tiny_llama_dir, noisy_draft_dir)
    drafter = eng.scheduler.speculative.drafter
    params = [greedy(), SamplingParams(max_new_tokens=MAX_NEW, temperature=1.0, seed=3,
                                       ignore_eos=True), greedy()]
    rids = [eng.submit(p, sp) for p, sp in zip(PROMPTS, params)]
    for i in range(60):
        if i == 4:
            assert drafter.tracked, "the draft model never ran"
            eng.abort(rids[1])
        eng.step()
        eng.check_invariant()
        drafter.check({r.rid for r in eng.scheduler.running})
        if all(eng.result(r)["finished"] for r in rids):
            break
    assert eng.result(rids[1])["meta_info"]["finish_reason"] == "abort"
    assert eng.result(rids[0])["output_ids"] == reference[0]
    assert eng.result(rids[2])["output_ids"] == reference[2]
    eng.step()  # idle: the draft KV of the last finished request goes back
    assert_all_slots_back(eng, 2048)
    assert_draft_pool_empty(eng)


def test_retraction_frees_draft_kv(tiny_llama_dir, noisy_draft_dir, reference):
    small = len(PROMPTS[1]) + MAX_NEW + 6
    eng = engine(tiny_llama_dir, noisy_draft_dir, max_total_tokens=small,
                 chunked_prefill_size=-1, init_new_token_ratio=0.1, min_new_token_ratio=0.1)
    got = [o["output_ids"] for o in eng.generate([PROMPTS[1]] * 3, greedy())]
    assert got == [reference[1]] * 3
    assert eng.scheduler.num_retractions > 0
    eng.step()
    assert_all_slots_back(eng, small)
    assert_draft_pool_empty(eng)


def test_other_vocabulary_is_refused(tiny_llama_dir, tmp_path):
    other = make_tiny_llama(str(tmp_path / "v128"), vocab_size=128)
    with pytest.raises(DraftVocabError, match="vocabulary has 128 tokens"):
        engine(tiny_llama_dir, other)
    with pytest.raises(ValueError, match="go together"):
        Engine(model=tiny_llama_dir, dtype="float32", device="cpu",
               speculative_algorithm="STANDALONE")


@pytest.mark.slow
def test_rejection_sampling_with_a_draft_model_is_exact(tiny_llama_dir, noisy_draft_dir):
    n = 3000
    law, _ = _exact(tiny_llama_dir)
    eng = engine(tiny_llama_dir, noisy_draft_dir, max_total_tokens=8192,
                 max_running_requests=64, speculative_disable_by_batch_size=64,
                 speculative_num_draft_tokens=2)
    counts: dict[tuple[int, ...], int] = {}
    for start in range(0, n, 64):
        params = [SamplingParams(max_new_tokens=4, temperature=1.0, top_k=TOP_K, seed=s,
                                 ignore_eos=True) for s in range(start, min(n, start + 64))]
        for o in eng.generate([PROMPT] * len(params), params):
            key = tuple(o["output_ids"][:3])
            counts[key] = counts.get(key, 0) + 1
    eng.step()
    assert_all_slots_back(eng, 8192)
    assert_draft_pool_empty(eng)
    assert set(counts) <= set(law), set(counts) - set(law)
    stat, dof = chi_square(law, counts, n)
    assert stat < chi2_critical(dof), (stat, dof, chi2_critical(dof))
    hist = eng.scheduler.speculative.stats.accept_hist  # the residual and acceptance both ran
    assert hist[0] > n // 20 and sum(hist[1:]) > n // 20, eng.scheduler.speculative.stats.as_dict()
