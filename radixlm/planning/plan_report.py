"""A MemoryPlan as text (the start-up log, `radixlm memory`) and as JSON.

The table has one row per pool -- weights, KV cache (with req_to_token, its index), and
activations -- with bytes, share of the device and what the bytes buy; then the flags
the plan was made with, the verdict (what runs out first, in which phase, and which flag
moves it), and the problems.
"""

from __future__ import annotations

from typing import Any

from radixlm.planning.planner import MemoryPlan
from radixlm.planning.units import fmt_bytes
from radixlm.planning.weight_estimate import WeightEstimate


def _share(plan: MemoryPlan, n: int) -> str:
    return f"{100.0 * n / plan.device_total:5.1f}%"


def plan_table(plan: MemoryPlan, weights: WeightEstimate | None = None) -> str:
    """The three pools as an aligned table (no trailing newline)."""
    p = plan
    w_detail = ""
    if weights is not None:
        w_detail = f"{weights.num_params / 1e9:.2f}B params (from {weights.source})"
    fits = lambda ok: "fits" if ok else "DOES NOT FIT"  # noqa: E731
    rows = [
        ("weights", p.weight_bytes, w_detail),
        ("KV cache", p.kv_bytes,
         f"{p.kv_tokens:,} tokens x {fmt_bytes(p.kv_bytes_per_token)}"
         f" (page {p.page_size}; limited by {p.kv_limited_by})"),
        ("req_to_token", p.req_to_token_bytes,
         f"{p.max_running_requests} rows x {p.context_len} positions"),
        ("activations", p.activation_headroom,
         f"prefill chunk {p.prefill_chunk}: ~{fmt_bytes(p.prefill_peak)} ({fits(p.prefill_fits)});"
         f" decode x{p.max_running_requests}: ~{fmt_bytes(p.decode_peak)}"
         f" ({fits(p.decode_fits)})"),
    ]
    other = p.device_total - p.weight_bytes - p.available_after_weights
    if other > 0:
        rows.append(("not available", other, "in use before the engine (other processes, "
                                              "CUDA context)"))
    head = (f"memory plan: {p.device_kind} device of {fmt_bytes(p.device_total)} "
            f"({p.device_source}), per TP rank (tp {p.tp_size})")
    lines = [head, f"  {'pool':<14}{'bytes':>12}  {'share':>6}  detail"]
    for name, n, detail in rows:
        lines.append(f"  {name:<14}{fmt_bytes(n):>12}  {_share(p, n):>6}  {detail}")
    for fmt, n in sorted(p.weight_formats.items(), key=lambda kv: -kv[1]):
        lines.append(f"    weights: {fmt:<52}{fmt_bytes(n):>12}")
    lines.append(f"  --mem-fraction-static {p.mem_fraction_static:.2f} ({p.mem_fraction_rule})")
    lines.append(f"  --max-running-requests {p.max_running_requests} ({p.max_running_rule})")
    return "\n".join(lines)


def verdict(plan: MemoryPlan) -> list[str]:
    """What runs out first, in which phase, and which flag to change, with numbers."""
    p = plan
    if p.fatal:
        return ["WILL NOT START: " + pr.text() for pr in p.fatal]
    out: list[str] = []
    full = p.kv_tokens // p.context_len
    per_req = p.kv_tokens // p.max_running_requests
    if per_req < p.context_len:
        more = (f"raise --mem-fraction-static (+0.01 = +{p.kv_tokens_per_fraction_point:,} "
                f"tokens, while the activation pool still holds its peak)"
                if p.kv_limited_by == "memory" else "raise --max-total-tokens")
        out.append(
            f"First to run out: the KV pool, in decode. It holds {p.kv_tokens:,} tokens: "
            f"{full} requests at the full context of {p.context_len}, or the "
            f"{p.max_running_requests} running requests at {per_req:,} tokens each. Past "
            f"that the scheduler retracts requests (recomputed later). To hold more: {more}, "
            f"or lower --max-running-requests.")
    else:
        out.append(
            f"The KV pool ({p.kv_tokens:,} tokens) holds all {p.max_running_requests} running "
            f"requests at the full context of {p.context_len}: concurrency is limited by "
            f"--max-running-requests, not by the KV pool.")
    need = max(p.prefill_peak, p.decode_peak)
    margin = p.activation_headroom - need
    phase = "prefill" if p.prefill_peak >= p.decode_peak else "decode"
    if margin >= 0:
        out.append(
            f"Activations: the {phase} peak (~{fmt_bytes(need)}) fits the activation pool "
            f"({fmt_bytes(p.activation_headroom)}) with {fmt_bytes(margin)} to spare.")
    for pr in p.problems:
        out.append(("ERROR: " if pr.fatal else "WARNING: ") + pr.text())
    return out


def plan_json(plan: MemoryPlan, weights: WeightEstimate | None = None) -> dict[str, Any]:
    d = plan.to_dict()
    if weights is not None:
        from dataclasses import asdict

        d["weights"] = {**asdict(weights), "total_bytes": weights.total_bytes}
    d["verdict"] = verdict(plan)
    return d
