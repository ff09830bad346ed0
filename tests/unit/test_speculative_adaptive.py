"""AdaptiveDraft (speculative/adaptive.py): the per-request switch-off, probes and k."""

from radixlm.speculative.adaptive import FIRST_PAUSE, MAX_PAUSE, AdaptiveDraft


def _run(st: AdaptiveDraft, steps: int, accept) -> list[int]:
    """Steps at which the request verified; `accept(k)` is how many of k drafts are taken."""
    verified = []
    for step in range(steps):
        k = st.budget(step)
        if k:
            verified.append(step)
            st.record(step, k, accept(k))
    return verified


def test_always_rejected_stops_and_probes_with_growing_pauses():
    st = AdaptiveDraft(3)
    v = _run(st, 200, lambda k: 0)
    assert v[:2] == [0, 1]  # 0.5 -> 0.25 -> 0.125: off after the second miss
    gaps = [b - a for a, b in zip(v[1:], v[2:])]
    assert gaps[:3] == [FIRST_PAUSE, 2 * FIRST_PAUSE, MAX_PAUSE] and set(gaps[3:]) == {MAX_PAUSE}
    assert st.k == 1  # shrunk on every miss


def test_always_accepted_drafts_every_step_at_full_k():
    st = AdaptiveDraft(3)
    assert _run(st, 50, lambda k: k) == list(range(50)) and st.k == 3


def test_a_good_probe_turns_drafting_back_on_and_k_grows_back():
    st = AdaptiveDraft(4)
    _run(st, 2, lambda k: 0)
    assert st.budget(2) == 0 and st.k == 2
    v = _run(st, 100, lambda k: k)  # the workload turns copy-heavy
    assert v[0] == 1 + FIRST_PAUSE and v[1:4] == [v[0] + 1, v[0] + 2, v[0] + 3]
    assert st.k == 4 and st.pause == FIRST_PAUSE


def test_half_accepted_keeps_drafting():
    st = AdaptiveDraft(3)
    assert len(_run(st, 40, lambda k: k // 2)) == 40
