"""AdaptiveDraft (speculative/adaptive.py): the per-request switch-off, probes and k."""

import itertools

from radixlm.speculative.adaptive import FIRST_PAUSE, MAX_PAUSE, AdaptiveDraft, break_even


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
    st = AdaptiveDraft(4)
    v = _run(st, 400, lambda k: 0)
    # k 4 -> 3 -> 2 -> 1, rate 0.5 -> 0.25 -> 0.125 -> 0.0625: below break_even(1) at the third
    assert v[:3] == [0, 1, 2] and st.k == 1
    gaps = [b - a for a, b in zip(v[2:], v[3:])]
    doubling = []
    while not doubling or doubling[-1] < MAX_PAUSE:
        doubling.append(min(MAX_PAUSE, FIRST_PAUSE * 2 ** len(doubling)))
    assert gaps[:len(doubling)] == doubling and set(gaps[len(doubling):]) == {MAX_PAUSE}


def test_verifies_that_pay_keep_drafting():
    """Half the verifies accept one draft, the others none: each verify yields 1.5 tokens on
    average at k of 1-3, more than the 1.13-1.26 decode steps it costs."""
    st = AdaptiveDraft(4)
    turn = itertools.cycle([1, 0])
    assert len(_run(st, 60, lambda k: min(k, next(turn)))) == 60


def test_break_even_is_the_share_where_a_verify_pays_for_itself():
    for k in (1, 2, 4, 7):
        # 1 + share * k tokens for 1 + VERIFY_ROW_COST * (k + 1) steps
        assert break_even(k) * k == break_even(1) * (k + 1) / 2
    assert break_even(1) > break_even(4) > 0


def test_always_accepted_drafts_every_step_at_full_k():
    st = AdaptiveDraft(3)
    assert _run(st, 50, lambda k: k) == list(range(50)) and st.k == 3


def test_a_good_probe_turns_drafting_back_on_and_k_grows_back():
    st = AdaptiveDraft(4)
    _run(st, 3, lambda k: 0)
    assert st.budget(3) == 0 and st.k == 1
    v = _run(st, 100, lambda k: k)  # the workload turns copy-heavy
    assert v[0] == 2 + FIRST_PAUSE and v[1:4] == [v[0] + 1, v[0] + 2, v[0] + 3]
    assert st.k == 4 and st.pause == FIRST_PAUSE


def test_half_accepted_keeps_drafting():
    st = AdaptiveDraft(3)
    assert len(_run(st, 40, lambda k: k // 2)) == 40
