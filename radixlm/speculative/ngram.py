"""NGRAM drafter: prompt lookup over the request's own prompt and output.

The draft is what followed the most recent earlier occurrence of the request's longest
suffix of n tokens (ngram_max down to ngram_min). Per request an index maps every n-gram
ending at position e < len(tokens) to its latest e; it grows by the tokens appended since
the last call (O(new tokens x n's) per step, the prompt once at the first call), so a
lookup never scans the sequence. A match is followed: when the tokens appended since the
last draft equal what followed its source, the next draft continues from there without a
new lookup (the match then spans everything copied since it began, longer than any n-gram,
so a locally ambiguous n-gram does not jump to another copy). Invariant: a draft is
always tokens[e:e + k] for some e < len(tokens).
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
    src: int = -1  # where the last draft was copied from (-1: none)
    at: int = 0  # len(tokens) when it was proposed


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
            idx.upto, idx.src = 0, -1
        lo, hi = self.ngram_min, self.ngram_max
        for e in range(max(idx.upto, lo), n_tok):  # grams ending at e, continued by tokens[e]
            for n in range(lo, min(hi, e) + 1):
                idx.grams[tuple(tokens[e - n:e])] = e
        idx.upto = max(idx.upto, n_tok)
        e = self._follow(idx, tokens, n_tok)
        if e is None:
            e = next((e for n in range(min(hi, n_tok), lo - 1, -1)
                      if (e := idx.grams.get(tuple(tokens[n_tok - n:]))) is not None), None)
        idx.src, idx.at = (-1, 0) if e is None else (e, n_tok)
        return Draft() if e is None else Draft(tokens[e:e + k])

    @staticmethod
    def _follow(idx: _Index, tokens: list[int], n_tok: int) -> int | None:
        """The last draft's source advanced by the tokens appended since, if they equal
        what followed it there (the request kept copying); else None."""
        d = n_tok - idx.at
        if idx.src < 0 or d < 0 or idx.src + d >= n_tok:
            return None
        return idx.src + d if tokens[idx.at:n_tok] == tokens[idx.src:idx.src + d] else None
