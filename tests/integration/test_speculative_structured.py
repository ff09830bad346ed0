"""Speculative decoding of constrained requests (radixlm/speculative/grammar_drafts.py).

Default model, the schemas, regex and choice of test_structured_output.py. Each draft is
checked against the request's xgrammar matcher (accepted, then rolled back; cut at the
first rejected token) and the verify rows are masked. Greedy outputs with NGRAM and with
SUFFIX (a warm cache: the second run drafts the cached constrained outputs) equal those
without speculation (jump-forward off in both, so the token streams are comparable), every
output validates, verify steps ran (SUFFIX: most cached tokens accepted), the pools are
whole; with
jump-forward on, every output still validates.
"""

from __future__ import annotations

import pytest

from tests.conftest import requires_default_model
from tests.integration.test_structured_output import (  # noqa: F401 (fixture)
    _all_back, _cases, _params, make_engine)

pytestmark = [requires_default_model, pytest.mark.slow]
jsonschema = pytest.importorskip("jsonschema")


def _run(engine, **kw) -> list[list[int]]:
    cases = _cases(engine)
    outs = engine.generate([p for p, _, _ in cases], [_params(c, **kw) for _, c, _ in cases])
    for (_, _, check), out in zip(cases, outs):
        assert out["meta_info"]["finish_reason"] == "stop", out
        check(out["text"])
    _all_back(engine)
    return [o["output_ids"] for o in outs]


@pytest.fixture(scope="module")
def reference(make_engine):
    return _run(make_engine(disable_jump_forward=True))


@pytest.mark.parametrize("alg", ["NGRAM", "SUFFIX"])
def test_constrained_greedy_equals_no_speculation(make_engine, reference, alg):
    eng = make_engine(disable_jump_forward=True, speculative_algorithm=alg,
                      speculative_disable_by_batch_size=16)
    assert _run(eng) == reference
    assert _run(eng) == reference  # SUFFIX: now every cached output is drafted
    stats = eng.scheduler.speculative.stats
    assert stats.verify_steps > 0, stats.as_dict()  # constrained requests were verified
    if alg == "SUFFIX":  # (NGRAM's drafts from these short prompts are rarely right)
        assert stats.accepted > sum(len(r) for r in reference) // 2, stats.as_dict()


def test_constrained_with_jump_forward_and_sampling_validate(make_engine):
    eng = make_engine(speculative_algorithm="SUFFIX", speculative_disable_by_batch_size=16)
    _run(eng)
    _run(eng)
    _run(eng, temperature=1.0, seed=11)
    assert eng.scheduler.speculative.stats.accepted > 0
