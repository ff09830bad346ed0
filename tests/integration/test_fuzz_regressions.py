"""Inputs the API fuzzer found that passed validation and then crashed the scheduler
(which takes the whole server down): each now gets a normal answer."""

from __future__ import annotations

import pytest

from radixlm import Engine
from radixlm.sampling_params import SamplingParams
from tests.engine_checks import assert_all_slots_back


@pytest.fixture(scope="module")
def engine(tiny_llama_dir: str) -> Engine:
    return Engine(model=tiny_llama_dir, max_total_tokens=1024)


@pytest.mark.parametrize("temperature", [5e-324, 1e-300, 1e-30, 1e-8])
def test_tiny_temperatures_sample_greedily(engine: Engine, temperature: float) -> None:
    # Dividing float32 logits by these overflowed (inf/NaN probabilities: torch.multinomial
    # raised in the scheduler).
    greedy = engine.generate([5, 6, 7], SamplingParams(max_new_tokens=4, temperature=0))
    got = engine.generate([5, 6, 7], SamplingParams(max_new_tokens=4, temperature=temperature,
                                                    seed=3))
    assert got["output_ids"] == greedy["output_ids"]
    assert_all_slots_back(engine)


@pytest.mark.parametrize("temperature", [1e5, 1e300])
def test_huge_temperatures_sample(engine: Engine, temperature: float) -> None:
    out = engine.generate([5, 6, 7], SamplingParams(max_new_tokens=4, temperature=temperature,
                                                    seed=3, ignore_eos=True))
    assert len(out["output_ids"]) == 4
    assert_all_slots_back(engine)


@pytest.mark.parametrize("kind,spec,generated", [
    ("json_object", "", 0),      # refused when admitted: no first token of JSON exists
    ("regex", r"w1\{", 1),       # refused after "w1": the vocabulary has no "{"
])
def test_grammar_the_vocabulary_cannot_follow_is_a_400(engine: Engine, kind: str, spec: str,
                                                       generated: int) -> None:
    # The tiny model's vocabulary is "w0".."w252" and specials: a grammar needing "{" left
    # no token allowed, the all -inf row sampled token 0, and its rejection was a 500.
    from radixlm.constrained.constraint import Constraint

    out = engine.generate([5, 6, 7], SamplingParams(
        max_new_tokens=8, temperature=0, constraint=Constraint(kind, spec, "field_x")))
    meta = out["meta_info"]
    assert meta["finish_reason"] == "abort" and meta["error_status"] == 400, meta
    assert meta["error"].startswith(f"invalid field_x: after {generated} generated tokens "
                                    "the grammar allows no token"), meta["error"]
    ok = engine.generate([5, 6, 7], SamplingParams(max_new_tokens=3, temperature=0,
                                                   ignore_eos=True))
    assert len(ok["output_ids"]) == 3
    assert_all_slots_back(engine)
