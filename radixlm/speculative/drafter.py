"""The drafter interface: per request, the tokens it guesses come next.

A `Drafter` proposes, for each running request, up to `max_tokens[i]` draft tokens that
continue the request's tokens so far (prompt + output), and optionally each position's draft
distribution (`Draft.probs`, [k, V]; None = a point mass on the token, as for the lookup
drafters here; an EAGLE-like head or a draft model would fill it). Drafters only read the
requests and the radix tree; they own no KV and never change the tree. `forget(rid)` drops
per-request state once a request leaves. `factory.make_drafter` is the one place a name becomes a class.
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

    def propose(self, reqs: list["Req"], max_tokens: list[int]) -> list[Draft]: ...

    def forget(self, rid: str) -> None: ...
