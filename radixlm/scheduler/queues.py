"""The scheduler's request queues and the run-time limits that OOM recovery may lower.

A request is in at most one queue: `waiting` (not admitted, or a chunked prefill between
chunks, holding its row), `running` (decoding), `finishing` (answered; its row and KV go
back once no launched batch reads it). Limits only ever go down (docs/memory.md, "Out of
memory at run time")."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from radixlm.scheduler.req import Req


@dataclass
class Queues:
    waiting: deque[Req] = field(default_factory=deque)
    running: list[Req] = field(default_factory=list)
    finishing: list[Req] = field(default_factory=list)

    def holders(self) -> list[Req]:
        """Every request that may hold a row or KV slots."""
        return [*self.running, *self.waiting, *self.finishing]


@dataclass
class RunLimits:
    max_prefill_tokens: int  # caps each prefill batch (and chunk)
    max_running_requests: int  # caps the running requests (admission)
