"""The drafters of radixlm/speculative/: NGRAM's longest-suffix prompt lookup (incremental
index, latest occurrence), SUFFIX's continuation in the radix tree (read-only, most recent
branch), and the factory's refusals."""

from __future__ import annotations

import pytest
import torch

from radixlm.mem import KVSlotAllocator, ReqToTokenPool
from radixlm.mem.radix_cache import RadixCache
from radixlm.sampling_params import SamplingParams
from radixlm.scheduler.req import Req
from radixlm.speculative.factory import make_drafter
from radixlm.speculative.ngram import NgramDrafter
from radixlm.speculative.suffix import SuffixDrafter


def req(ids: list[int], out: list[int] = (), rid: str = "r") -> Req:
    return Req(rid=rid, input_ids=list(ids), sampling_params=SamplingParams(),
               output_ids=list(out))


def test_ngram_longest_suffix_latest_occurrence():
    d = NgramDrafter(1, 3)
    # "5 6" occurs twice, followed by 7 then by 9; the suffix "4 5 6" only once (-> 7 8).
    r = req([4, 5, 6, 7, 8, 1, 5, 6, 9, 2, 4, 5, 6])
    assert d.propose([r], [2])[0].tokens == [7, 8]
    r2 = req([5, 6, 7, 1, 5, 6, 9, 3, 5, 6], rid="r2")
    assert d.propose([r2], [3])[0].tokens == [9, 3, 5]  # "5 6": the latest earlier one
    assert d.propose([req([1, 2, 3], rid="r3")], [4])[0].tokens == []
    assert d.propose([r], [0])[0].tokens == []


def test_ngram_index_grows_with_the_output():
    d = NgramDrafter(2, 2)
    r = req([10, 11, 12, 13])
    assert d.propose([r], [3])[0].tokens == []
    r.output_ids += [10, 11]  # now "10 11" repeats: continue with 12 13 10
    assert d.propose([r], [3])[0].tokens == [12, 13, 10]
    r.output_ids += [12, 99]
    assert d.propose([r], [3])[0].tokens == []
    d.forget("r")
    assert d._index == {}


def test_ngram_follows_an_accepted_match():
    d = NgramDrafter(1, 2)
    r = req([1, 2, 3, 8, 7, 2, 3, 9], [1])
    assert d.propose([r], [3])[0].tokens == [2, 3, 8]  # "1" occurs once
    r.output_ids += [2, 3]  # it copied on: follow the match (8), not the latest "2 3" (9)
    assert d.propose([r], [3])[0].tokens == [8, 7, 2]
    assert d.propose([r], [3])[0].tokens == [8, 7, 2]  # proposed again, nothing appended
    r.output_ids += [8, 5]  # diverged: a fresh lookup ("8 5" and "5" occur nowhere)
    assert d.propose([r], [3])[0].tokens == []
    r.output_ids += [2]  # "5 2" nowhere, "2": its latest earlier occurrence (output: 3 8 5)
    assert d.propose([r], [3])[0].tokens == [3, 8, 5]


def _tree(seqs: list[list[int]], page_size: int = 1) -> RadixCache:
    alloc = KVSlotAllocator(256, torch.device("cpu"), page_size=page_size)
    cache = RadixCache(ReqToTokenPool(4, 64, torch.device("cpu")), alloc, page_size=page_size)
    for s in seqs:
        cache.insert(s, alloc.alloc(len(s)))
    return cache


def test_suffix_follows_the_most_recent_branch():
    cache = _tree([[1, 2, 3, 4, 5, 6], [1, 2, 3, 7, 8]])  # the second is the most recent
    d = SuffixDrafter(cache)
    assert d.propose([req([1, 2], [3])], [3])[0].tokens == [7, 8]
    assert d.propose([req([1, 2, 3, 4])], [5])[0].tokens == [5, 6]
    assert d.propose([req([1, 2])], [2])[0].tokens == [3, 7]
    assert d.propose([req([9, 2])], [2])[0].tokens == []
    assert d.propose([req([1, 2, 3, 4, 5, 6])], [2])[0].tokens == []
    before = [(n.id, list(n.key), n.last_access_time) for n in cache._iter_nodes()]
    assert [(n.id, list(n.key), n.last_access_time) for n in cache._iter_nodes()] == before


def test_suffix_with_pages():
    cache = _tree([[1, 2, 3, 4, 5, 6, 7, 8]], page_size=2)
    d = SuffixDrafter(cache)
    assert d.propose([req([1, 2, 3])], [3])[0].tokens == [4, 5, 6]
    assert d.propose([req([1, 2, 3, 4])], [3])[0].tokens == [5, 6, 7]


def test_rejection_sampling_rule():
    """min(1, p/q) acceptance, the residual norm(max(0, p - q)) on rejection, the bonus
    after full acceptance: the emitted first token follows p (exact frequencies)."""
    from radixlm.speculative.rejection import accept_with_probs
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    q = torch.tensor([[0.1, 0.6, 0.0, 0.3]], dtype=torch.float64)
    assert accept_with_probs(p, q, [], 3, None) == [3]
    gen = torch.Generator().manual_seed(0)
    n, counts, full = 20000, [0, 0, 0, 0], 0
    for _ in range(n):
        d = int(torch.multinomial(q[0], 1, generator=gen))
        out = accept_with_probs(p, q, [d], 3, gen)
        counts[out[0]] += 1
        full += len(out) == 2
        assert len(out) == 1 or out == [d, 3]
    assert counts[3] == 0  # p(3) = 0: never emitted, though q drafts it 30% of the time
    for c, want in zip(counts, p[0].tolist()):
        assert abs(c / n - want) < 0.015, (counts, p[0])
    # P(accept) = sum min(p, q) = 0.1 + 0.3 + 0 + 0 = 0.4
    assert abs(full / n - 0.4) < 0.015


def test_factory():
    cache = _tree([])
    assert make_drafter("ngram", cache).name == "NGRAM"
    assert make_drafter("SUFFIX", cache).name == "SUFFIX"
    with pytest.raises(ValueError, match="needs --speculative-draft-model-path"):
        make_drafter("STANDALONE", cache)
    with pytest.raises(ValueError, match="unknown"):
        make_drafter("EAGLE", cache)
    with pytest.raises(ValueError):
        NgramDrafter(3, 2)


class _FakeMatcher:
    """Accepts token t after token t - 1 only (starting at 10), terminates at 14."""

    def __init__(self) -> None:
        self.seq: list[int] = []

    def _next(self) -> int:
        return self.seq[-1] + 1 if self.seq else 10

    def accept(self, tok: int) -> bool:
        if tok != self._next() or self.is_terminated():
            return False
        self.seq.append(tok)
        return True

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        bitmask[row] = self._next()  # one number per row stands for the allowed token

    def is_terminated(self) -> bool:
        return bool(self.seq) and self.seq[-1] == 14

    def rollback(self, n: int) -> None:
        del self.seq[-n:]


class _FakeBackend:
    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        return torch.full((rows, 1), -7, dtype=torch.int32)

    @staticmethod
    def allow_all(bitmask: torch.Tensor, row: int) -> None:
        bitmask[row] = -1


def test_grammar_drafts_cut_mask_and_roll_back():
    from radixlm.speculative.drafter import Draft
    from radixlm.speculative.grammar_drafts import GrammarDrafts
    a, b, c, free = req([1], rid="a"), req([1], rid="b"), req([1], rid="c"), req([1], rid="d")
    for r in (a, b, c):
        r.grammar = _FakeMatcher()
    c.grammar.seq = [10, 11]
    probs = torch.full((3, 4), 0.25)
    drafts = [Draft([10, 11, 99, 12]), Draft([10, 99, 5], probs), Draft([12, 13, 14, 15]),
              Draft([3, 4])]
    g = GrammarDrafts(_FakeBackend(), [a, b, c, free], drafts)
    # a: cut before the rejected 99; b (drawn): keeps 99 (p = 0 rejects it); c: cut after
    # the terminating 14; the unconstrained request is untouched.
    assert [d.tokens for d in g.drafts] == [[10, 11], [10, 99], [12, 13, 14], [3, 4]]
    assert g.drafts[1].probs.shape == (2, 4)
    assert a.grammar.seq == [] and b.grammar.seq == [] and c.grammar.seq == [10, 11]
    # rows: a 0..2 (next 10, 11, 12), b 3..5 (10, 11, never read), c 6..9 (12, 13, 14, any)
    assert g.bitmask[:10, 0].tolist() == [10, 11, 12, 10, 11, -1, 12, 13, 14, -1]
    assert g.rows == list(range(10)) and g.bitmask.shape[0] == 13
