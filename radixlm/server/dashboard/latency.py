"""LatencyWindow: TTFT and inter-token latency of recently finished requests.

One `record` per finished request (never per token): its time to first token and its
mean inter-token latency, (finish - first token) / (completion tokens - 1). The window
keeps the last `MAX_REQUESTS`; percentiles are taken over those within `horizon_s`.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

MAX_REQUESTS = 2000


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]) of an ascending list; None if empty."""
    if not sorted_values:
        return None
    k = min(len(sorted_values) - 1, max(0, round(q / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[k]


@dataclass
class LatencyWindow:
    entries: deque[tuple[float, float, float | None]] = field(
        default_factory=lambda: deque(maxlen=MAX_REQUESTS))

    def record(self, ttft_s: float, decode_s: float, completion_tokens: int) -> None:
        itl = decode_s / (completion_tokens - 1) if completion_tokens > 1 else None
        self.entries.append((time.monotonic(), ttft_s, itl))

    def summary(self, horizon_s: float = 60.0) -> dict[str, float | int | None]:
        """p50/p90/p99 of TTFT and ITL in ms over the last `horizon_s` seconds."""
        since = time.monotonic() - horizon_s
        recent = [e for e in self.entries if e[0] >= since]
        ttft = sorted(e[1] * 1e3 for e in recent)
        itl = sorted(e[2] * 1e3 for e in recent if e[2] is not None)
        out: dict[str, float | int | None] = {"requests": len(recent), "horizon_s": horizon_s}
        for q in (50, 90, 99):
            out[f"ttft_p{q}_ms"] = percentile(ttft, q)
            out[f"itl_p{q}_ms"] = percentile(itl, q)
        return out
