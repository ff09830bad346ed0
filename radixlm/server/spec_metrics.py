"""/metrics of speculative decoding (from PoolStats.speculative, i.e. SpecStats); absent
when --speculative-algorithm is off. One algorithm per server: /get_server_info names it.
The acceptance-length histogram is one counter per length (accepted drafts 0..16)."""

from __future__ import annotations

from collections.abc import Callable

from radixlm.server.metrics import MetricDef, Snapshot, pool_field

HIST_LENGTHS = 17


def _hist(a: int) -> Callable[[Snapshot], float | None]:
    def value(s: Snapshot) -> float | None:
        sp = None if s.pool is None else s.pool.speculative
        if sp is None or a >= len(sp["accept_hist"]):
            return None
        return float(sp["accept_hist"][a])
    return value


SPEC_METRICS: list[MetricDef] = [
    MetricDef("radixlm_spec_verify_steps", "Verify forwards run in place of decode steps.",
              "counter", pool_field("speculative", "verify_steps")),
    MetricDef("radixlm_spec_verifies", "Request verifications (a request with a draft in a "
              "verify step).", "counter", pool_field("speculative", "verifies")),
    MetricDef("radixlm_spec_drafted_tokens", "Draft tokens verified.", "counter",
              pool_field("speculative", "drafted")),
    MetricDef("radixlm_spec_accepted_tokens", "Draft tokens accepted.", "counter",
              pool_field("speculative", "accepted")),
    MetricDef("radixlm_spec_mean_acceptance_length", "Tokens per request verification "
              "(accepted drafts + 1).", "gauge",
              pool_field("speculative", "mean_acceptance_length")),
    *[MetricDef(f"radixlm_spec_accept_length_{a}", f"Request verifications that accepted "
                f"{a} draft tokens.", "counter", _hist(a)) for a in range(HIST_LENGTHS)],
]
