"""Speculative decoding (radixlm/speculative/) leaves greedy outputs unchanged, frees every
rejected slot, and handles stops, max_tokens, aborts and retraction.

Default model (SmolLM2-135M, float32). The reference: no speculation. Against it, NGRAM and
SUFFIX with overlap on and off, 16-token prefill chunks, a warm radix cache (SUFFIX then
drafts whole cached outputs) and a pool small enough to retract. A copy-heavy prompt (edit a
code snippet) must accept drafts, so a verify step that does nothing cannot pass. After
every run the pool invariant holds and every slot is free or evictable cache.
"""

from __future__ import annotations

import functools

import pytest

from radixlm import SamplingParams
from radixlm.engine import Engine
from tests.conftest import requires_default_model
from tests.engine_checks import assert_all_slots_back

pytestmark = [requires_default_model, pytest.mark.slow]

POOL = 4096
MAX_NEW = 40
SYSTEM = ("You are a careful and concise assistant for a school quiz. Answer every question "
          "in one short sentence and never add any greeting or extra commentary.")
QUESTIONS = ["What is the capital of France?", "Who wrote Hamlet?"]
CODE = '''def fibonacci(n):
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
    a, b = 0, 1
    for _ in range(n - 1):
        a, b = b, a + b
    return b
'''
COPY = "Rename the function fibonacci to fib and output the whole code:\n" + CODE


@pytest.fixture(scope="module")
def make_engine():
    import radixlm.executor.model_runner as mr

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mr, "load_model", functools.cache(mr.load_model))

        def make(**kw) -> Engine:
            kw.setdefault("max_total_tokens", POOL)
            return Engine(dtype="float32", device="cpu", **kw)

        yield make


def greedy(n: int = MAX_NEW, **kw) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0.0, **kw)


@pytest.fixture(scope="module")
def reference(make_engine):
    eng = make_engine(disable_radix_cache=True, chunked_prefill_size=-1)
    tok = eng.tokenizer
    prompts = [tok.encode(tok.apply_chat_template(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
        tokenize=False, add_generation_prompt=True), add_special_tokens=False)
        for q in [*QUESTIONS, COPY]]
    outs = [o["output_ids"] for o in eng.generate(prompts, greedy())]
    return prompts, outs


def check(eng: Engine, prompts, want, min_accepted: int = 1) -> None:
    got = [o["output_ids"] for o in eng.generate(prompts, greedy())]
    assert got == want
    assert_all_slots_back(eng, POOL)
    stats = eng.scheduler.speculative.stats
    assert stats.accepted >= min_accepted, stats.as_dict()


@pytest.mark.parametrize("alg", ["NGRAM", "SUFFIX"])
@pytest.mark.parametrize("overlap", [False, True])
def test_greedy_equals_no_speculation(make_engine, reference, alg, overlap):
    prompts, want = reference
    eng = make_engine(speculative_algorithm=alg, disable_overlap_schedule=not overlap)
    # Cold: NGRAM copies from the prompt; SUFFIX has nothing cached beyond the prompts yet.
    got = [o["output_ids"] for o in eng.generate(prompts, greedy())]
    assert got == want
    assert_all_slots_back(eng, POOL)
    # Warm radix cache: SUFFIX now drafts the cached outputs.
    check(eng, prompts, want, min_accepted=MAX_NEW // 2)


@pytest.mark.parametrize("alg", ["NGRAM", "SUFFIX"])
def test_chunked_prefill_and_one_at_a_time(make_engine, reference, alg):
    prompts, want = reference
    eng = make_engine(speculative_algorithm=alg, chunked_prefill_size=16,
                      speculative_num_draft_tokens=6)
    for p, w in zip(prompts, want):  # batch 1: every step may speculate
        assert eng.generate(p, greedy())["output_ids"] == w
    assert_all_slots_back(eng, POOL)
    check(eng, prompts, want)


def test_batch_size_limit_turns_speculation_off(make_engine, reference, monkeypatch):
    import radixlm.speculative.controller as controller
    sizes: list[int] = []
    real = controller.prepare_verify

    def spy(batch, drafts):
        sizes.append(len(batch.reqs))
        return real(batch, drafts)

    monkeypatch.setattr(controller, "prepare_verify", spy)
    prompts, want = reference
    eng = make_engine(speculative_algorithm="NGRAM", speculative_disable_by_batch_size=1)
    got = [o["output_ids"] for o in eng.generate(prompts, greedy())]
    assert got == want
    # Three decode together at first: no verify until only one is left.
    assert sizes and max(sizes) == 1
    assert_all_slots_back(eng, POOL)


def test_stops_and_max_tokens_inside_an_accepted_run(make_engine, reference):
    prompts, want = reference
    copy_prompt, copy_want = prompts[-1], want[-1]
    eng = make_engine(speculative_algorithm="SUFFIX")
    assert eng.generate(copy_prompt, greedy())["output_ids"] == copy_want  # now cached
    for n in (1, 2, 7, 13):  # max_tokens lands inside a run of whole cached drafts
        out = eng.generate(copy_prompt, greedy(n))
        assert out["output_ids"] == copy_want[:n]
        assert out["meta_info"]["finish_reason"] == "length"
    stop_tok = copy_want[9]
    first = copy_want.index(stop_tok)
    out = eng.generate(copy_prompt, greedy(stop_token_ids=[stop_tok]))
    assert out["output_ids"] == copy_want[:first + 1]
    assert out["meta_info"]["matched_stop"] == stop_tok
    text = eng.tokenizer.decode(copy_want)
    stop = text[len(text) // 2:len(text) // 2 + 3]
    out = eng.generate(copy_prompt, greedy(stop=[stop]))
    assert out["meta_info"]["finish_reason"] == "stop"
    assert copy_want[:len(out["output_ids"])] == out["output_ids"]
    assert stop not in out["text"]
    assert eng.scheduler.speculative.stats.accepted > 0
    assert_all_slots_back(eng, POOL)


def test_abort_mid_run(make_engine, reference):
    prompts, want = reference
    eng = make_engine(speculative_algorithm="SUFFIX", disable_overlap_schedule=False)
    eng.generate(prompts, greedy())  # cached: long accepted runs
    rids = [eng.submit(p, greedy()) for p in prompts]
    for _ in range(4):
        eng.step()
    eng.abort(rids[-1])
    while not all(eng.result(r)["finished"] for r in rids):
        eng.step()
        eng.check_invariant()
    assert eng.result(rids[-1])["meta_info"]["finish_reason"] == "abort"
    assert eng.result(rids[0])["output_ids"] == want[0]
    assert_all_slots_back(eng, POOL)


def test_retraction_under_a_tiny_pool(make_engine, reference):
    prompts, want = reference
    # Three copies of the copy-heavy prompt share its KV; their outputs do not fit together.
    small = len(prompts[-1]) + MAX_NEW + 8
    eng = make_engine(speculative_algorithm="NGRAM", max_total_tokens=small,
                      chunked_prefill_size=-1, init_new_token_ratio=0.1, min_new_token_ratio=0.1)
    got = [o["output_ids"] for o in eng.generate([prompts[-1]] * 3, greedy())]
    assert got == [want[-1]] * 3
    assert eng.scheduler.num_retractions > 0
    assert eng.scheduler.speculative.stats.accepted > 0
    assert_all_slots_back(eng, small)


def test_logprobs_and_streaming(make_engine, reference):
    """Logprobs with speculation are the target's without it; a stream carries several
    accepted tokens per delta and its text adds up to the whole output's."""
    prompts, want = reference
    params = greedy(logprobs=True, top_logprobs=2)
    ref = make_engine(disable_radix_cache=True).generate(prompts[-1], params)
    assert ref["output_ids"] == want[-1]
    eng = make_engine(speculative_algorithm="NGRAM")
    rid = eng.submit(prompts[-1], params, stream=True)
    deltas: list[tuple[list[int], str]] = []
    while not eng.result(rid)["finished"]:
        deltas += [(o.token_ids_delta, o.text_delta) for o in eng.step()
                   if o.rid == rid and o.token_ids_delta]
    eng.settle()
    got = eng.pop_result(rid)
    assert got["output_ids"] == want[-1]
    assert [t for d, _ in deltas for t in d] == want[-1]
    assert "".join(t for _, t in deltas) == ref["text"] == got["text"]
    assert max(len(d) for d, _ in deltas) > 1, [len(d) for d, _ in deltas]
    assert [lp.token_id for lp in got["logprobs"]] == want[-1]
    for a, b in zip(got["logprobs"], ref["logprobs"], strict=True):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-3)
        assert [t for t, _ in a.top] == [t for t, _ in b.top]
    assert eng.scheduler.speculative.stats.accepted > 0
    assert_all_slots_back(eng, POOL)


class _Oracle:
    """A drafter that knows the reference output: `shift` 0 drafts it (always accepted),
    1 drafts each next token + 1 (always rejected: the target's argmax is the reference)."""
    name, costly, tracked = "ORACLE", False, frozenset()

    def __init__(self, prompt: list[int], want: list[int], shift: int) -> None:
        self.prompt, self.want, self.shift = prompt, want, shift

    def forget(self, rid: str) -> None:
        pass

    def propose(self, reqs, max_tokens):
        from radixlm.speculative.drafter import Draft
        out = []
        for r, k in zip(reqs, max_tokens):
            i = len(r.fill_ids) - len(self.prompt)
            out.append(Draft([t + self.shift for t in self.want[i:i + k]]))
        return out


@pytest.mark.parametrize("shift", [0, 1])
def test_adaptive_drafting(make_engine, reference, shift):
    """Drafts that are always rejected stop after a bounded number of verifies (3 as k
    shrinks 4 -> 1, then one probe per pause of 4, 8, 16, ... steps); drafts always
    accepted keep drafting at full k.
    Either way the output is the greedy one without speculation."""
    prompts, want = reference
    eng = make_engine(speculative_algorithm="NGRAM", disable_radix_cache=True)
    spec = eng.scheduler.speculative
    spec.drafter = _Oracle(prompts[-1], want[-1], shift)
    assert eng.generate(prompts[-1], greedy())["output_ids"] == want[-1]
    st = spec.stats
    if shift:  # 40 tokens: verifies at steps 1-3, then probes near 7, 15, 31 (63: past the end)
        assert st.accepted == 0 and 1 <= st.verifies <= 6, st.as_dict()
    else:  # every verify takes all k drafts: about 40 / (k + 1) verifies
        assert st.accepted == st.drafted and st.verifies <= MAX_NEW // spec.k, st.as_dict()
    assert_all_slots_back(eng, POOL)
