"""PrefillAdder: which waiting requests join the next EXTEND batch, and how much of each.

More: docs/scheduler.md, "scheduler/prefill_adder.py".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from radixlm.scheduler.req import Req

# Like SGLang's CLIP_MAX_NEW_TOKENS_ESTIMATION: a huge max_new_tokens (the default is often
# "up to the context") should not block admission; requests rarely use all of it.
CLIP_MAX_NEW_TOKENS = 4096


def expected_growth(req: Req, new_token_ratio: float) -> int:
    """KV slots `req` is expected to still need for decoding:
    ceil(min(remaining, CLIP_MAX_NEW_TOKENS) * new_token_ratio), at most remaining."""
    remaining = max(0, min(req.remaining_new_tokens, CLIP_MAX_NEW_TOKENS))
    # The epsilon keeps a product that is an integer up to float rounding from rounding up.
    return min(remaining, math.ceil(remaining * new_token_ratio - 1e-9))


@dataclass
class PrefillAdder:
    free_kv_slots: int
    free_rows: int
    prefill_budget: int
    chunking: bool
    running: list[Req]
    new_token_ratio: float
    page_size: int = 1
    mixed_with_running: bool = False
    admitted: list[Req] = field(default_factory=list)
    prefill_tokens: int = 0
    new_rows: int = 0

    def __post_init__(self) -> None:
        self.kv_budget = self.free_kv_slots - sum(self.growth(r) for r in self.running)
        if self.mixed_with_running:
            # The running requests' next tokens are computed in this very batch.
            self.kv_budget -= sum(self.kv_cost(r, 1) for r in self.running)
            self.prefill_budget -= len(self.running)

    def growth(self, req: Req) -> int:
        return expected_growth(req, self.new_token_ratio)

    def kv_cost(self, req: Req, n: int) -> int:
        """KV slots taken to compute positions [kv_len, kv_len + n) of `req`: its fresh
        pages, page_size * (ceil((kv_len + n) / page) - ceil(kv_len / page)); n at page 1."""
        p = self.page_size
        return p * (-(-(req.kv_len + n) // p) + (req.kv_len // -p))  # a // -p == -ceil(a / p)

    def max_tokens_within(self, req: Req, budget: int) -> int:
        """The most positions `req` can compute from kv_len with `budget` KV slots: the rest
        of its partly filled last page plus budget // page_size fresh pages."""
        p = self.page_size
        if budget < 0:
            return 0
        return (-(-req.kv_len // p) + budget // p) * p - req.kv_len

    def try_add(self, req: Req) -> bool:
        """Admit (a chunk of) `req` if every budget allows; False stops the scan.
        Mutates the budgets and `req.extend_input_len` when admitting."""
        needs_row = req.req_pool_idx is None
        if needs_row and self.new_rows >= self.free_rows:
            return False
        left = self.prefill_budget - self.prefill_tokens
        n = req.extend_len
        if n > left:
            if self.chunking:
                n = left
            elif self.admitted:
                return False
        growth = self.growth(req)
        if (self.chunking and n == req.extend_len
                and self.kv_cost(req, n) + growth > self.kv_budget):
            # A prompt larger than the KV left: one chunk of it.
            n = min(n, self.max_tokens_within(req, self.kv_budget))
        last_chunk = n == req.extend_len
        need = self.kv_cost(req, n) + (growth if last_chunk else 0)
        if n <= 0 or need > self.kv_budget:
            return False
        req.extend_input_len = n
        self.kv_budget -= need
        self.prefill_tokens += n
        self.new_rows += needs_row
        self.admitted.append(req)
        return True
