"""NGRAM drafter: prompt lookup over the request's own prompt and output.

The draft is what followed the most recent earlier occurrence of the request's longest
suffix of n tokens (ngram_max down to ngram_min). Per request an index maps every n-gram
ending at position e < len(tokens) to its latest e; it grows by the tokens appended since
the last call (O(new tokens x n's) per step, the prompt once at the first call), so a
lookup never scans the sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from radixlm.speculative.drafter import Draft

if TYPE_CHECKING:
    from radixlm.scheduler.req import Req


@dataclass
class _Index:
    grams: dict[tuple[int, ...], int] = field(default_factory=dict)
    upto: int = 0  # every gram ending before this position is indexed


class NgramDrafter:
    name = "NGRAM"
    costly = False

    def __init__(self, ngram_min: int = 2, ngram_max: int = 5) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"need 1 <= --speculative-ngram-min ({ngram_min}) <= "
                             f"--speculative-ngram-max ({ngram_max})")
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        self._index: dict[str, _Index] = {}

    def propose(self, reqs: list["Req"], max_tokens: list[int]) -> list[Draft]:
        return [self._one(r, k) if k > 0 else Draft() for r, k in zip(reqs, max_tokens)]

    @property
    def tracked(self) -> set[str]:
        return set(self._index)

    def forget(self, rid: str) -> None:
        self._index.pop(rid, None)

    def _one(self, req: "Req", k: int) -> Draft:
        tokens = req.fill_ids
        n_tok = len(tokens)
        idx = self._index.setdefault(req.rid, _Index())
        if idx.upto > n_tok:  # the request was rolled back (e.g. retracted and re-run)
            idx.grams.clear()
            idx.upto = 0
        lo, hi = self.ngram_min, self.ngram_max
        for e in range(max(idx.upto, lo), n_tok):  # grams ending at e, continued by tokens[e]
            for n in range(lo, min(hi, e) + 1):
                idx.grams[tuple(tokens[e - n:e])] = e
        idx.upto = max(idx.upto, n_tok)
        for n in range(min(hi, n_tok), lo - 1, -1):
            e = idx.grams.get(tuple(tokens[n_tok - n:]))
            if e is not None:
                return Draft(tokens[e:e + k])
        return Draft()
