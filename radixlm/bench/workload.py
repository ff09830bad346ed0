"""Deterministic random-token workloads: the same seed gives the same prompts everywhere.

Prompts are token ids, not text, so both engines see exactly the same input with no
tokenizer round trip; ids are drawn uniformly from the vocabulary minus special tokens
(BOS/EOS/chat markers would change what the model does, e.g. make it stop early).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RandomWorkload:
    num_prompts: int = 64
    input_len_min: int = 128
    input_len_max: int = 512  # inclusive
    output_len: int = 128
    seed: int = 0

    def validate(self) -> None:
        if self.num_prompts < 1:
            raise ValueError(f"--num-prompts must be >= 1, got {self.num_prompts}")
        if not 1 <= self.input_len_min <= self.input_len_max:
            raise ValueError(f"need 1 <= --input-len-min <= --input-len-max, got "
                             f"{self.input_len_min}..{self.input_len_max}")
        if self.output_len < 1:
            raise ValueError(f"--output-len must be >= 1, got {self.output_len}")

    def max_seq_len(self) -> int:
        return self.input_len_max + self.output_len


def special_token_ids(tokenizer: Any) -> set[int]:
    """Ids of the tokenizer's special tokens: the named ones (bos/eos/pad/unk...) and every
    added token flagged special (chat markers such as <|im_start|>)."""
    ids = {int(i) for i in getattr(tokenizer, "all_special_ids", [])}
    for idx, tok in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(tok, "special", False):
            ids.add(int(idx))
    return ids


def random_prompts(workload: RandomWorkload, vocab_size: int,
                   excluded_ids: Iterable[int] = ()) -> list[list[int]]:
    """`num_prompts` prompts with lengths uniform in [input_len_min, input_len_max] and ids
    uniform over range(vocab_size) minus `excluded_ids`. Pure function of its arguments."""
    workload.validate()
    excluded = set(excluded_ids)
    allowed = [i for i in range(vocab_size) if i not in excluded]
    if not allowed:
        raise ValueError("no token ids left to draw from")
    rng = random.Random(workload.seed)
    # Draw all lengths first, then the ids: changing one prompt's length does not shift
    # the lengths of the others.
    lengths = [rng.randint(workload.input_len_min, workload.input_len_max)
               for _ in range(workload.num_prompts)]
    return [[allowed[rng.randrange(len(allowed))] for _ in range(n)] for n in lengths]
