"""GrammarDrafts: drafts of constrained requests checked against their grammar, and the
verify batch's token bitmask.

For a constrained request, its matcher accepts the draft tokens one by one (row j's mask is
filled before d_{j+1} is tried: the tokens allowed after d_1..d_j), the draft is cut at the
first token the grammar rejects (a drawn draft, with probs, keeps it: p = 0 rejects it in
rejection sampling) or after the one that terminates it, and the matcher rolls back all it
accepted: afterwards every matcher is as before. Unconstrained rows allow every token. `apply(logits)` masks the verify rows like a
GrammarStep does for a decode (ForwardTask.grammar), so every target token obeys the
grammar; the scheduler thread then advances the matchers by the emitted tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from radixlm.constrained.backend import GrammarBackend
from radixlm.speculative.drafter import Draft

if TYPE_CHECKING:
    from radixlm.scheduler.req import Req


class GrammarDrafts:
    def __init__(self, backend: GrammarBackend, reqs: list["Req"], drafts: list[Draft]) -> None:
        self.backend = backend
        bitmask = backend.allocate_bitmask(sum(len(d.tokens) + 1 for d in drafts))
        self.rows: list[int] = []
        self.drafts: list[Draft] = []
        row = 0
        for r, d in zip(reqs, drafts):
            d = self._check(r, d, bitmask, row) if r.grammar is not None else d
            if r.grammar is not None:
                self.rows.extend(range(row, row + len(d.tokens) + 1))
            self.drafts.append(d)
            row += len(d.tokens) + 1
        self.bitmask = bitmask[:row]

    def _check(self, req: "Req", draft: Draft, bitmask: torch.Tensor, row: int) -> Draft:
        m = req.grammar
        n, rejected = 0, False
        for tok in draft.tokens:
            if m.is_terminated():
                break
            m.fill_bitmask(bitmask, row + n)
            if not m.accept(tok):
                rejected = True
                break
            n += 1
        if m.is_terminated():
            self.backend.allow_all(bitmask, row + n)  # the stop token ended it
        elif not rejected or draft.probs is None:
            m.fill_bitmask(bitmask, row + n)
        if n:
            m.rollback(n)
        if rejected and draft.probs is not None:
            # A drawn draft keeps the token the grammar rejects: the target's masked law
            # gives it p = 0, so min(1, p/q) rejects it and the residual is drawn, as the
            # law requires (cutting before it would emit a plain draw from p instead).
            self.backend.allow_all(bitmask, row + n + 1)  # never read: rejection stops first
            n += 1
        if n == len(draft.tokens):
            return draft
        return Draft(draft.tokens[:n], None if draft.probs is None else draft.probs[:n])

    def apply(self, logits: torch.Tensor) -> None:
        """Forward thread: mask the constrained rows of the verify logits in place."""
        if self.rows:
            self.backend.apply_bitmask(logits, self.bitmask, self.rows)
