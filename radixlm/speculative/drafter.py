"""The drafter interface: per request, the tokens it guesses come next.

A `Drafter` proposes, for each running request, up to `max_tokens[i]` draft tokens that
continue the request's tokens so far (prompt + output), and optionally each position's draft
distribution (`Draft.probs`, [k, V], the law each token was drawn from; None = a point mass,
as for the lookup drafters and greedy requests; the draft model fills it, an EAGLE-like
head would too). Drafters never change the target's pools or the radix tree; the draft model
owns a KV pool of its own (draft_model.py). `forget(rid)` drops per-request state (and its
KV) once a request leaves; a drafter with `costly = True` is proposed to once per step.
`factory.make_drafter` is the one place a name becomes a class.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from radixlm.scheduler.req import Req


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    probs: torch.Tensor | None = None  # [len(tokens), V] draft distribution; None: point mass


class Drafter(Protocol):
    name: str
    costly: bool  # proposing runs forwards: proposed to once per step, from exact state

    @property
    def tracked(self) -> set[str]:
        """Requests it holds state (or KV) for."""
        ...

    def propose(self, reqs: list["Req"], max_tokens: list[int]) -> list[Draft]: ...

    def forget(self, rid: str) -> None: ...
