"""make_drafter: the --speculative-algorithm name -> its Drafter (the one place it is chosen)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixlm.speculative.draft_model import DraftModelDrafter
from radixlm.speculative.drafter import Drafter
from radixlm.speculative.ngram import NgramDrafter
from radixlm.speculative.suffix import SuffixDrafter

if TYPE_CHECKING:
    from radixlm.mem.radix_cache import RadixCache


def make_drafter(algorithm: str, tree_cache: "RadixCache", ngram_min: int = 2,
                 ngram_max: int = 5, draft_model_path: str | None = None, runner=None,
                 tokenizer=None, k: int = 4) -> Drafter:
    """The drafter of `--speculative-algorithm`; ValueError for an unknown one. STANDALONE
    loads `draft_model_path` on the target `runner`'s device (its vocabulary checked
    against `tokenizer`)."""
    name = algorithm.upper()
    if name == "NGRAM":
        return NgramDrafter(ngram_min, ngram_max)
    if name == "SUFFIX":
        return SuffixDrafter(tree_cache)
    if name == "STANDALONE":
        if draft_model_path is None or runner is None:
            raise ValueError("--speculative-algorithm STANDALONE needs "
                             "--speculative-draft-model-path")
        return DraftModelDrafter.load(draft_model_path, runner, tokenizer, k)
    raise ValueError(f"unknown --speculative-algorithm {algorithm!r}: NGRAM, SUFFIX or "
                     "STANDALONE")
