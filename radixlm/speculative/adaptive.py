"""Per-request adaptive drafting: how many tokens a request drafts, and whether it drafts.

Each request keeps an exponential moving average `rate` of its accepted / drafted share
(starting at `START`, weight `ALPHA` per verify). A verify of k drafts costs about
1 + VERIFY_ROW_COST * (k + 1) decode steps and yields 1 + accepted tokens, so it pays while
the share is above `break_even(k)`; when the rate falls below it the request stops
drafting for `pause` steps, then probes with one draft (its rate set to the break-even
share, so a probe that accepts nothing turns it off again at once, with the pause doubled
up to `MAX_PAUSE`; a probe that accepts restores the first pause). Its draft length `k`
starts at the configured maximum, drops by one after a verify that accepted nothing and
grows by one after one that accepted everything (never below 1, never above the maximum).
So a request whose drafts are never accepted verifies 3 times from k = 4 (k shrinking),
then once per pause (4, 8, 16, ... 64 steps). Invariants: only the budget changes; outputs
do not depend on it. Why these numbers: docs/speculative.md, "Adaptive drafting".
"""

from __future__ import annotations

from dataclasses import dataclass

START = 0.5  # the rate a new request starts with
ALPHA = 0.5  # weight of the newest verify in the rate
# What a verify row costs beyond the decode step it replaces, in decode steps: on the CPU
# verifies of 1 / 2 / 3 / 4 / 7 drafts cost 1.12 / 1.18 / 1.24 / 1.36 / 1.64 steps
# (scripts/verify_step_cost.py, default model, batch 1).
VERIFY_ROW_COST = 0.065
FIRST_PAUSE = 4  # steps without drafts after the first switch-off
MAX_PAUSE = 64


def break_even(k: int) -> float:
    """The accepted share at which a verify of k drafts costs what it saves."""
    return VERIFY_ROW_COST * (k + 1) / k


@dataclass
class AdaptiveDraft:
    k_max: int
    k: int = 0  # this request's current draft length (0 until __post_init__)
    rate: float = START
    pause: int = FIRST_PAUSE
    off_until: int = 0  # the controller's step before which this request does not draft

    def __post_init__(self) -> None:
        if self.k == 0:
            self.k = self.k_max

    def budget(self, step: int) -> int:
        """Draft tokens this request may propose at controller step `step`."""
        return 0 if step < self.off_until else self.k

    def record(self, step: int, drafted: int, accepted: int) -> None:
        """Update after a verify of `drafted` > 0 tokens of which `accepted` were taken."""
        probe = self.rate < break_even(self.k)  # turned off before: this was a probe
        if probe:
            self.rate = break_even(self.k)
        self.rate = (1 - ALPHA) * self.rate + ALPHA * accepted / drafted
        if accepted == drafted:
            self.k = min(self.k_max, self.k + 1)
        elif accepted == 0:
            self.k = max(1, self.k - 1)
        if self.rate < break_even(self.k):
            self.off_until = step + self.pause
            self.pause = min(2 * self.pause, MAX_PAUSE)
        elif probe or accepted:
            self.pause = FIRST_PAUSE
