"""GrammarStats: counters of constrained decoding, shown in /metrics and /server_info."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class GrammarStats:
    compiles: int = 0  # compilations that ran (cache misses), failed ones included
    compile_failures: int = 0
    compile_timeouts: int = 0  # requests refused because compilation passed the timeout
    compile_s: float = 0.0
    compile_s_max: float = 0.0
    cache_hits: int = 0
    cache_misses: int = 0
    queue_wait_s: float = 0.0  # from arrival to leaving the grammar queue, summed
    queued_requests: int = 0
    mask_s: float = 0.0  # bitmask fill on the CPU, summed over steps
    mask_steps: int = 0  # steps with at least one constrained row
    constrained_rows: int = 0  # sampled rows that were constrained
    sampled_rows: int = 0  # all sampled rows since the first constrained request

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}
