"""Speculation counters per algorithm: drafted, accepted, verify rows, acceptance lengths.

`accept_hist[a]` counts verifications of one request that accepted `a` draft tokens (0..k).
Plain counters on the scheduler thread; `as_dict` is what /metrics and /server_info show.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    algorithm: str
    num_draft_tokens: int
    verify_steps: int = 0  # verify forwards run
    verifies: int = 0  # (request, step) pairs with a draft
    drafted: int = 0
    accepted: int = 0
    accept_hist: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.accept_hist:
            self.accept_hist = [0] * (self.num_draft_tokens + 1)

    def record(self, drafted: int, accepted: int) -> None:
        self.verifies += 1
        self.drafted += drafted
        self.accepted += accepted
        self.accept_hist[min(accepted, len(self.accept_hist) - 1)] += 1

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verified request step: accepted drafts + the target's own token."""
        return 1.0 + self.accepted / self.verifies if self.verifies else 0.0

    def as_dict(self) -> dict:
        return {"algorithm": self.algorithm, "num_draft_tokens": self.num_draft_tokens,
                "verify_steps": self.verify_steps, "verifies": self.verifies,
                "drafted": self.drafted, "accepted": self.accepted,
                "accept_rate": self.accepted / self.drafted if self.drafted else 0.0,
                "mean_acceptance_length": self.mean_acceptance_length,
                "accept_hist": list(self.accept_hist)}
