"""/metrics shows speculative decoding's counters (PoolStats.speculative) and its
acceptance-length histogram; nothing when speculation is off."""

from radixlm.messages import PoolStats
from radixlm.server.metrics import EngineMetrics, Snapshot
from radixlm.server.spec_metrics import SPEC_METRICS
from radixlm.speculative.stats import SpecStats


def _value(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def _render(spec: dict | None) -> str:
    pool = PoolStats(rid="x", total_kv_slots=8, free_kv_slots=8, held_by_requests=0,
                     held_by_cache=0, running=0, waiting=0, free_req_rows=1,
                     speculative=spec)
    snap = Snapshot(plan=None, pool=pool, requests_finished_total=0, prompt_tokens_total=0,
                    generation_tokens_total=0, max_running_requests=None)
    return EngineMetrics("m", SPEC_METRICS).render(snap).decode()


def test_spec_metrics():
    st = SpecStats("NGRAM", 4)
    for drafted, accepted in [(4, 4), (4, 0), (2, 1)]:
        st.record(drafted, accepted)
    st.verify_steps = 3
    d = st.as_dict()
    assert d["mean_acceptance_length"] == 1 + 5 / 3
    text = _render(d)
    assert _value(text, "radixlm_spec_drafted_tokens_total") == 10
    assert _value(text, "radixlm_spec_accepted_tokens_total") == 5
    assert _value(text, "radixlm_spec_accept_length_4_total") == 1
    assert _value(text, "radixlm_spec_accept_length_0_total") == 1
    assert _value(text, "radixlm_spec_accept_length_5_total") is None  # beyond k
    assert _value(_render(None), "radixlm_spec_drafted_tokens_total") is None
