"""RoutingLog: the router's last routing decisions (instance, reason, prefix match ratio,
every instance's load), bounded to `LOG_LEN`, shown by the router's GET /dashboard
(router/dashboard.py). Recording one is O(instances)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixlm.router.policy import Decision

LOG_LEN = 100


@dataclass
class RoutingLog:
    entries: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=LOG_LEN))
    seq: int = 0

    def record(self, decision: Decision, text_len: int, workers: list[Any]) -> None:
        self.seq += 1
        self.entries.append({"seq": self.seq, "t": time.time(), "worker": decision.worker.url,
                             "reason": decision.reason, "match_ratio": decision.match_ratio,
                             "text_chars": text_len,
                             "loads": {w.url: w.load for w in workers}})
