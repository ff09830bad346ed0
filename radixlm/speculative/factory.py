"""make_drafter: the --speculative-algorithm name -> its Drafter (the one place it is chosen)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixlm.speculative.drafter import Drafter
from radixlm.speculative.ngram import NgramDrafter
from radixlm.speculative.suffix import SuffixDrafter

if TYPE_CHECKING:
    from radixlm.mem.radix_cache import RadixCache


def make_drafter(algorithm: str, tree_cache: "RadixCache", ngram_min: int = 2,
                 ngram_max: int = 5) -> Drafter:
    """The drafter of `--speculative-algorithm`; ValueError for an unknown or unbuilt one."""
    name = algorithm.upper()
    if name == "NGRAM":
        return NgramDrafter(ngram_min, ngram_max)
    if name == "SUFFIX":
        return SuffixDrafter(tree_cache)
    if name == "STANDALONE":
        raise ValueError("--speculative-algorithm STANDALONE (a draft model) is not implemented "
                         "yet; use NGRAM or SUFFIX")
    raise ValueError(f"unknown --speculative-algorithm {algorithm!r}: NGRAM or SUFFIX")
