"""The grammar-backend interface: what the scheduler needs from a constrained-decoding
library. xgrammar is the implementation (`xgrammar_backend.py`); llguidance uses the same
bitmask layout and would be a second class behind this interface.

Bitmask layout (shared by xgrammar and llguidance): int32 `[rows, ceil(vocab / 32)]`,
bit `t % 32` of word `t // 32` of a row set = token `t` allowed. `vocab` is the LM head's
size (it can exceed the tokenizer's; the extra ids are never allowed).
"""

from __future__ import annotations

import functools
import sys
from abc import ABC, abstractmethod
from typing import Any

import torch

from radixlm.constrained.constraint import Constraint


class GrammarMatcher(ABC):
    """The state of one constrained sequence (one request, one `n` sample). Used on the
    scheduler thread only. `vocab_size`: the LM head's (the bitmask's width)."""

    vocab_size: int

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

    def allows_no_token(self) -> bool:
        """No token of the vocabulary may come next: the grammar needs text this tokenizer
        cannot produce (e.g. a JSON format with a vocabulary without "{"). One bitmask
        fill: for admission and for the diagnosis of a rejected token, not per step."""
        mask = torch.zeros((1, (self.vocab_size + 31) // 32), dtype=torch.int32)
        self.fill_bitmask(mask, 0)
        bits = (mask[0].unsqueeze(1) >> torch.arange(32, dtype=torch.int32)) & 1
        return not bool(bits.flatten()[: self.vocab_size].any())

    def find_jump_forward_string(self) -> str:
        """The text every continuation must start with ("" when more than one first
        character is allowed); jump-forward decoding (`jump_forward.py`) appends it at once.
        The default finds none: a backend without it decodes token by token."""
        return ""

    def accept_string(self, text: str) -> bool:
        """Advance by `text` (bytes, regardless of tokenization); False if not allowed
        (the state is then unchanged). Needed only where `find_jump_forward_string` can
        return text."""
        raise NotImplementedError

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens (speculative drafts are checked by
        accepting them, then rolled back: radixlm/speculative/grammar_drafts.py)."""
        raise NotImplementedError


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
        """Uninitialized: only the rows a GrammarStep fills are ever read."""
        return torch.empty((rows, (self.vocab_size + 31) // 32), dtype=torch.int32)

    @staticmethod
    def allow_all(bitmask: torch.Tensor, row: int) -> None:
        bitmask[row].fill_(-1)

    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor,
                      rows: list[int]) -> None:
        """Set the disallowed logits of `rows` to -inf, in place; `bitmask` has one row
        per logits row (only `rows` are read). Vectorized: each bitmask byte indexes a
        [256, 8] table of additive masks (0 or -inf), so one gather and one add cover the
        batch -- no per-token Python, and faster on the CPU than unpacking bits by shifts."""
        assert sys.byteorder == "little", "the uint8 view assumes little-endian words"
        table = _additive_table(logits.device, logits.dtype)
        all_rows = len(rows) == logits.shape[0]
        mask = bitmask if all_rows else bitmask[torch.tensor(rows, dtype=torch.int64)]
        mask = mask.to(logits.device, non_blocking=True)
        # Byte k of word w holds tokens 32w + 8k .. 32w + 8k + 7 (bit j = token + j).
        add = table[mask.view(torch.uint8).int()].view(mask.shape[0], -1)[:, :logits.shape[-1]]
        if all_rows:
            logits.add_(add)
        else:
            idx = torch.tensor(rows, dtype=torch.int64, device=logits.device)
            logits[idx] = logits[idx] + add


@functools.cache
def _additive_table(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """[256, 8]: entry [b, j] is 0 if bit j of byte b is set, else -inf."""
    bits = (torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1
    return torch.where(bits.bool(), 0.0, float("-inf")).to(device=device, dtype=dtype)
