"""Per-request timings of a serving benchmark and the summary metrics computed from them.

Field names follow SGLang's `bench_serving` (`request_throughput`, `mean_ttft_ms`,
`p99_itl_ms`, ...) so results from the two tools can be put side by side.

Definitions (all times from the client's clock):
* TTFT: request sent -> first streamed chunk with output text.
* ITL: the gap between consecutive text chunks of one request (a chunk may carry more than
  one token; then one gap covers several tokens, as in SGLang).
* TPOT: (E2E latency - TTFT) / (output tokens - 1), per request with > 1 output token.
* E2E latency: request sent -> last byte of the response.
* Throughputs: completed requests' tokens / the benchmark's wall time (`duration`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class RequestResult:
    """What the client observed for one request."""

    success: bool = False
    error: str = ""
    prompt_len: int = 0  # tokens, as counted by the benchmark's tokenizer
    output_len: int = 0  # tokens: the server's usage.completion_tokens, else chunks counted
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, if reported
    server_prompt_tokens: int | None = None  # usage.prompt_tokens, if reported
    start_time: float = 0.0  # client clock when the request was sent
    ttft: float = 0.0  # seconds
    latency: float = 0.0  # seconds, E2E
    itl: list[float] = field(default_factory=list)  # seconds between text chunks
    generated_text: str = ""


def _stats(prefix: str, values_s: list[float], percentiles: tuple[int, ...]) -> dict[str, float]:
    """mean/median/std/pXX of `values_s` (seconds), reported in ms; zeros when empty."""
    a = np.asarray(values_s, dtype=np.float64) * 1000.0
    out = {f"mean_{prefix}_ms": float(a.mean()) if a.size else 0.0,
           f"median_{prefix}_ms": float(np.median(a)) if a.size else 0.0,
           f"std_{prefix}_ms": float(a.std()) if a.size else 0.0}
    for p in percentiles:
        out[f"p{p}_{prefix}_ms"] = float(np.percentile(a, p)) if a.size else 0.0
    return out


def compute_metrics(results: list[RequestResult], duration_s: float,
                    percentiles: tuple[int, ...] = (90, 95, 99)) -> dict[str, Any]:
    """The summary of one run. `duration_s` is the wall time from the first request sent to
    the last response finished; failed requests count in `completed`'s complement only."""
    if duration_s <= 0:
        raise ValueError(f"duration must be > 0, got {duration_s}")
    ok = [r for r in results if r.success]
    input_tokens = sum(r.prompt_len for r in ok)
    output_tokens = sum(r.output_len for r in ok)
    tpots = [(r.latency - r.ttft) / (r.output_len - 1) for r in ok if r.output_len > 1]
    itls = [gap for r in ok for gap in r.itl]
    m: dict[str, Any] = {
        "duration": duration_s,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(ok) / duration_s,
        "input_throughput": input_tokens / duration_s,
        "output_throughput": output_tokens / duration_s,
        "total_throughput": (input_tokens + output_tokens) / duration_s,
        # Mean number of requests in flight: the summed E2E latencies over the wall time.
        "concurrency": sum(r.latency for r in ok) / duration_s,
    }
    m.update(_stats("ttft", [r.ttft for r in ok], percentiles))
    m.update(_stats("tpot", tpots, percentiles))
    m.update(_stats("itl", itls, percentiles))
    m.update(_stats("e2e_latency", [r.latency for r in ok], percentiles))
    m["max_itl_ms"] = max(itls) * 1000.0 if itls else 0.0
    m.update(cache_metrics(ok))
    return m


def cache_metrics(ok: list[RequestResult]) -> dict[str, Any]:
    """Cache hit rate = cached prompt tokens / prompt tokens, both as the server reported
    them (its own tokenizer); None unless every completed request reported both."""
    if not ok or any(r.cached_tokens is None or r.server_prompt_tokens is None for r in ok):
        return {"total_cached_tokens": None, "cache_hit_rate": None}
    cached = sum(r.cached_tokens or 0 for r in ok)
    prompt = sum(r.server_prompt_tokens or 0 for r in ok)
    return {"total_cached_tokens": cached, "cache_hit_rate": cached / prompt if prompt else 0.0}
