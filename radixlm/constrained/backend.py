"""The grammar-backend interface: what the scheduler needs from a constrained-decoding
library. xgrammar is the implementation (`xgrammar_backend.py`); llguidance uses the same
bitmask layout and would be a second class behind this interface.

Bitmask layout (shared by xgrammar and llguidance): int32 `[rows, ceil(vocab / 32)]`,
bit `t % 32` of word `t // 32` of a row set = token `t` allowed. `vocab` is the LM head's
size (it can exceed the tokenizer's; the extra ids are never allowed).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from radixlm.constrained.constraint import Constraint


class GrammarMatcher(ABC):
    """The state of one constrained sequence (one request, one `n` sample). Used on the
    scheduler thread only."""

    @abstractmethod
    def accept(self, token_id: int) -> bool:
        """Advance by one sampled token; False if the grammar does not allow it (the
        state is then unchanged)."""

    @abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the tokens allowed next into `bitmask[row]`."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """The grammar is complete and accepted its end (a stop token): nothing more may
        be generated."""


class GrammarBackend(ABC):
    """One per model: built from the tokenizer and the LM head's vocabulary size."""

    vocab_size: int

    @abstractmethod
    def compile(self, constraint: Constraint) -> Any:
        """The compiled grammar (opaque, shared by all matchers of the same constraint).
        Thread-safe; raises on an invalid spec. May take long: called off the scheduler
        thread."""

    @abstractmethod
    def matcher(self, compiled: Any) -> GrammarMatcher:
        """A fresh matcher at the start of `compiled`."""

    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        return torch.full((rows, (self.vocab_size + 31) // 32), -1, dtype=torch.int32)

    @staticmethod
    def allow_all(bitmask: torch.Tensor, row: int) -> None:
        bitmask[row].fill_(-1)

    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor,
                      rows: list[int]) -> None:
        """Set the disallowed logits of `rows` to -inf, in place; `bitmask` has one row
        per logits row (only `rows` are read). Vectorized: no per-token Python."""
        idx = torch.tensor(rows, dtype=torch.int64)
        vocab = logits.shape[-1]
        bits = torch.arange(32, dtype=torch.int32)
        # [R, W, 32] -> [R, W*32]: bit b of word w is token w*32 + b.
        allowed = ((bitmask[idx].unsqueeze(-1) >> bits) & 1).bool().flatten(1)[:, :vocab]
        idx, allowed = idx.to(logits.device), allowed.to(logits.device, non_blocking=True)
        logits[idx] = logits[idx].masked_fill(~allowed, float("-inf"))
