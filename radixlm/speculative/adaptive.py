"""Per-request adaptive drafting: how many tokens a request drafts, and whether it drafts.

Each request keeps an exponential moving average `rate` of its accepted / drafted share
(starting at `START`, weight `ALPHA` per verify). When it falls below `LOW` the request
stops drafting for `pause` steps, then probes with one draft (its rate set to `LOW`, so a
probe that accepts nothing turns it off again at once, with the pause doubled up to
`MAX_PAUSE`; a probe that accepts restores the first pause). So a request whose drafts are
never accepted verifies 2 times, then once per pause (16, 32, 64, 64, ... steps). Its draft length `k` starts at the configured maximum, drops by one after a verify
that accepted nothing and grows by one after one that accepted everything (never below 1,
never above the maximum). Invariants: only the budget changes; outputs do not depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass

START = 0.5  # the rate a new request starts with
ALPHA = 0.5  # weight of the newest verify in the rate
LOW = 0.25  # below this rate the request stops drafting
FIRST_PAUSE = 16  # steps without drafts after the first switch-off
MAX_PAUSE = 64


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
        probe = self.rate < LOW  # turned off before: this was a probe
        if probe:
            self.rate = LOW
        self.rate = (1 - ALPHA) * self.rate + ALPHA * accepted / drafted
        if accepted == drafted:
            self.k = min(self.k_max, self.k + 1)
        elif accepted == 0:
            self.k = max(1, self.k - 1)
        if self.rate < LOW:
            self.off_until = step + self.pause
            self.pause = min(2 * self.pause, MAX_PAUSE)
        elif probe or accepted:
            self.pause = FIRST_PAUSE
