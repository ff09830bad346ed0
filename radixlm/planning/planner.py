"""MemoryPlan: the device split into three pools -- weights, KV cache, activations.

More: docs/memory.md, "planning/planner.py".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from radixlm.planning.activation import ActivationModel
from radixlm.planning.device_memory import DeviceMemory
from radixlm.planning.units import GiB, MiB, fmt_bytes
from radixlm.planning.weight_estimate import check_tp, kv_heads_per_rank

if TYPE_CHECKING:
    from radixlm.models.model_config import ModelConfig

ENGINE_KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "float32")

BASE_RESERVE = {"cuda": 1 * GiB, "cpu": 256 * MiB}
RESERVE_MARGIN = 1.5
DEFAULT_FRACTION_RANGE = (0.50, 0.93)
MAX_FRACTION = 0.99  # a fix never suggests more
MAX_RUNNING_CEILING = {"cuda": 4096, "cpu": 64}
CPU_DEFAULT_MAX_TOTAL_TOKENS = 65536


def default_max_total_tokens(device_kind: str) -> int | None:
    """The KV cap when --max-total-tokens is not given (see the module docstring)."""
    return CPU_DEFAULT_MAX_TOTAL_TOKENS if device_kind == "cpu" else None


def default_chunked_prefill_size(device_kind: str, total_bytes: int) -> int:
    """--chunked-prefill-size when not given. On the CPU compute, not memory, is the
    limit: 1024 tokens keep one chunk of the default model near a second. On CUDA, bigger
    devices take bigger chunks (more activation headroom), as SGLang's defaults do."""
    if device_kind != "cuda":
        return 1024
    total_gib = total_bytes / GiB
    return 2048 if total_gib < 24 else 4096 if total_gib < 80 else 8192


def default_mem_fraction_static(total_bytes: int, prefill_peak: int, device_kind: str) -> float:
    """f = 1 - (base reserve + RESERVE_MARGIN * prefill peak) / total, clamped, 2 decimals."""
    reserve = BASE_RESERVE.get(device_kind, BASE_RESERVE["cuda"]) + RESERVE_MARGIN * prefill_peak
    lo, hi = DEFAULT_FRACTION_RANGE
    f = math.floor((1.0 - reserve / total_bytes) * 100) / 100
    return min(hi, max(lo, f))


@dataclass(frozen=True)
class PlanProblem:
    """Something that will not work (fatal: the engine refuses to start) or will run out
    (a warning); `fixes` name the flags to change, in which direction, with values."""

    pool: str  # "weights" | "kv" | "activation"
    phase: str  # "start" | "prefill" | "decode"
    fatal: bool
    message: str
    fixes: list[str] = field(default_factory=list)

    def text(self) -> str:
        fixes = "; or ".join(self.fixes)
        return self.message + (f" Fix: {fixes}." if fixes else "")


@dataclass(frozen=True)
class MemoryPlan:
    device_kind: str
    device_total: int
    available_after_weights: int
    device_source: str
    weight_bytes: int
    mem_fraction_static: float
    mem_fraction_rule: str
    kv_dtype_bytes: int
    kv_bytes_per_token: int
    kv_tokens_from_memory: int  # what the static budget holds, before the cap
    kv_tokens: int  # the pool the engine allocates (slots)
    kv_limited_by: str  # "memory" | "--max-total-tokens"
    max_running_requests: int
    max_running_rule: str
    req_to_token_bytes: int
    context_len: int
    page_size: int
    tp_size: int
    prefill_chunk: int  # tokens of the largest prefill step planned for
    prefill_peak: int
    decode_peak: int  # one decode step of max_running_requests at full context
    activation: ActivationModel
    problems: list[PlanProblem] = field(default_factory=list)
    # Bytes of the loaded weights by format (models/linear/policy.weight_bytes_by_format);
    # empty when planned from shapes alone.
    weight_formats: dict[str, int] = field(default_factory=dict)
    # The hierarchical cache's host tier (planning/tier_plan.py): RAM, not device memory.
    host_tier_bytes: int = 0

    # --- the three pools --------------------------------------------------------------

    @property
    def kv_bytes(self) -> int:
        return self.kv_tokens * self.kv_bytes_per_token

    @property
    def activation_headroom(self) -> int:
        """Device memory left once weights, KV pool and req_to_token are allocated."""
        return self.available_after_weights - self.kv_bytes - self.req_to_token_bytes

    @property
    def fatal(self) -> list[PlanProblem]:
        return [p for p in self.problems if p.fatal]

    @property
    def prefill_fits(self) -> bool:
        return self.prefill_peak <= self.activation_headroom

    @property
    def decode_fits(self) -> bool:
        return self.decode_peak <= self.activation_headroom

    # --- what a fix needs (used by the problems and by the OOM diagnosis) -------------

    def fraction_for_headroom(self, need_bytes: int) -> float | None:
        """The largest f (2 decimals) whose activation pool holds `need_bytes`; None if no
        f > 0 does, or if the KV pool is capped by --max-total-tokens (f does not move it)."""
        if self.kv_limited_by != "memory":
            return None
        f = math.floor((1.0 - need_bytes / self.device_total) * 100) / 100
        return f if f > 0 else None

    def fraction_for_kv_tokens(self, tokens: int) -> float | None:
        """The smallest f (2 decimals) whose KV pool holds `tokens`; None above MAX_FRACTION."""
        need = tokens * self.kv_bytes_per_token + self.req_to_token_bytes
        # available - total * (1 - f) >= need  <=>  f >= 1 - (available - need) / total
        f = math.ceil((1.0 - (self.available_after_weights - need) / self.device_total) * 100) / 100
        return max(f, 0.01) if f <= MAX_FRACTION else None

    @property
    def kv_tokens_per_fraction_point(self) -> int:
        """KV tokens gained per +0.01 of --mem-fraction-static (while memory-limited)."""
        return int(0.01 * self.device_total // self.kv_bytes_per_token)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(kv_bytes=self.kv_bytes, activation_headroom=self.activation_headroom,
                 prefill_fits=self.prefill_fits, decode_fits=self.decode_fits)
        return d


def plan_memory(*, cfg: ModelConfig, weight_bytes: int, device: DeviceMemory, act_bytes: int,
                kv_bytes: int, context_len: int, chunked_prefill_size: int,
                max_prefill_tokens: int, page_size: int = 1, tp_size: int = 1,
                mem_fraction_static: float | None = None,
                weight_formats: dict[str, int] | None = None,
                max_running_requests: int | None = None, max_total_tokens: int | None = None,
                attention_backend: str = "torch") -> MemoryPlan:
    """The plan (see the module docstring). Never raises for lack of memory: what cannot
    work is listed in `problems` (fatal ones first), for the caller to refuse or report."""
    if mem_fraction_static is not None and not 0.0 < mem_fraction_static < 1.0:
        raise ValueError(f"--mem-fraction-static must be in (0, 1), got {mem_fraction_static}")
    if max_running_requests is not None and max_running_requests < 1:
        raise ValueError(f"--max-running-requests must be >= 1, got {max_running_requests}")
    check_tp(cfg, tp_size)
    total, avail = device.total_bytes, device.available_after_weights
    bpt = 2 * kv_heads_per_rank(cfg, tp_size) * cfg.head_dim * cfg.num_layers * kv_bytes
    act = ActivationModel.from_config(cfg, act_bytes, kv_bytes, tp_size, attention_backend)
    # The largest prefill step: one chunk (within the prefill budget), or without
    # chunking a whole prompt of up to the context.
    chunk = (min(chunked_prefill_size, max_prefill_tokens) if chunked_prefill_size > 0
             else context_len)
    chunk = min(chunk, context_len)
    prefill_peak = act.prefill_peak(chunk, context_len)
    if mem_fraction_static is None:
        f = default_mem_fraction_static(total, prefill_peak, device.kind)
        rule = (f"default: 1 - ({fmt_bytes(BASE_RESERVE.get(device.kind, GiB))} + "
                f"{RESERVE_MARGIN} x prefill peak {fmt_bytes(prefill_peak)}) / "
                f"{fmt_bytes(total)}, clamped to {DEFAULT_FRACTION_RANGE}")
    else:
        f, rule = mem_fraction_static, "--mem-fraction-static"
    static_budget = avail - total * (1.0 - f)

    def kv_tokens_for(req_to_token: int) -> tuple[int, int]:
        from_memory = max(0, int((static_budget - req_to_token) // bpt))
        capped = from_memory if max_total_tokens is None else min(from_memory, max_total_tokens)
        return from_memory, capped // page_size * page_size

    if max_running_requests is not None:
        rows, rows_rule = max_running_requests, "--max-running-requests"
    else:
        ceiling = MAX_RUNNING_CEILING.get(device.kind, MAX_RUNNING_CEILING["cuda"])
        _, kv0 = kv_tokens_for(0)
        fit = act.max_decode_batch_within(avail - kv0 * bpt, context_len, ceiling)
        rows = max(1, min(ceiling, kv0 // page_size, fit))
        rows_rule = (f"derived: min(ceiling {ceiling}, KV pages {kv0 // page_size}, "
                     f"decode batch that fits the activation pool {fit})")
    req_to_token = (rows + 1) * context_len * 4  # + the dummy row
    from_memory, kv_tokens = kv_tokens_for(req_to_token)
    limited_by = ("--max-total-tokens" if max_total_tokens is not None
                  and max_total_tokens < from_memory else "memory")
    headroom = avail - kv_tokens * bpt - req_to_token
    if max_running_requests is None:  # req_to_token may have taken from the activations
        rows = max(1, min(rows, act.max_decode_batch_within(headroom, context_len, rows)))
        req_to_token = (rows + 1) * context_len * 4
    plan = MemoryPlan(
        device_kind=device.kind, device_total=total, available_after_weights=avail,
        device_source=device.source, weight_bytes=weight_bytes, mem_fraction_static=f,
        mem_fraction_rule=rule, kv_dtype_bytes=kv_bytes, kv_bytes_per_token=bpt,
        kv_tokens_from_memory=from_memory, kv_tokens=kv_tokens, kv_limited_by=limited_by,
        max_running_requests=rows, max_running_rule=rows_rule, req_to_token_bytes=req_to_token,
        context_len=context_len, page_size=page_size, tp_size=tp_size, prefill_chunk=chunk,
        prefill_peak=prefill_peak, decode_peak=act.decode_peak(rows, context_len),
        activation=act, weight_formats=dict(weight_formats or {}))
    return _with_problems(plan)


def _with_problems(plan: MemoryPlan) -> MemoryPlan:
    from dataclasses import replace

    problems: list[PlanProblem] = []
    total, f = plan.device_total, plan.mem_fraction_static
    shrink = ("smaller weights: FP8 weights (about half of BF16) or more tensor-parallel "
              "ranks (--tp-size)")
    if plan.weight_bytes > total:
        problems.append(PlanProblem(
            "weights", "start", True,
            f"The weights ({fmt_bytes(plan.weight_bytes)} per rank) do not fit the device "
            f"({fmt_bytes(total)}).", [shrink]))
    elif plan.kv_tokens < plan.page_size:
        static = plan.available_after_weights - total * (1 - f)
        f_need = plan.fraction_for_kv_tokens(min(plan.context_len, 4096))
        fixes = [f"raise --mem-fraction-static to {f_need:.2f}" if f_need else "", shrink]
        problems.append(PlanProblem(
            "kv", "start", True,
            f"No KV cache pool: after the weights ({fmt_bytes(plan.weight_bytes)}), "
            f"--mem-fraction-static {f:.2f} of {fmt_bytes(total)} leaves "
            f"{fmt_bytes(static)} for the KV pool and req_to_token "
            f"({fmt_bytes(plan.req_to_token_bytes)}), less than one page of "
            f"{plan.page_size} tokens x {fmt_bytes(plan.kv_bytes_per_token)}. The fraction "
            f"must go UP (it is the share of the device for weights + KV).",
            [x for x in fixes if x]))
    elif plan.kv_tokens < plan.context_len:
        f_need = plan.fraction_for_kv_tokens(plan.context_len)
        fix = (f"raise --mem-fraction-static to {f_need:.2f}" if f_need
               and plan.kv_limited_by == "memory" else "raise --max-total-tokens"
               if plan.kv_limited_by != "memory" else shrink)
        problems.append(PlanProblem(
            "kv", "start", False,
            f"The KV pool holds {plan.kv_tokens} tokens, less than the context "
            f"({plan.context_len}): no request can be longer than {plan.kv_tokens} tokens.",
            [fix]))
    if any(p.fatal for p in problems):  # the activation pool is moot without weights/KV
        return replace(plan, problems=problems)
    headroom = plan.activation_headroom
    one = plan.activation.decode_peak(1, plan.context_len)
    if one > headroom:
        f_fit = plan.fraction_for_headroom(one)
        problems.append(PlanProblem(
            "activation", "decode", True,
            f"The activation pool ({fmt_bytes(headroom)}) cannot hold even one decode step "
            f"of one request (about {fmt_bytes(one)}).",
            [f"lower --mem-fraction-static to {f_fit:.2f}" if f_fit
             else "lower --max-total-tokens"]))
    if not plan.prefill_fits:
        chunk = plan.activation.max_chunk_within(headroom, plan.context_len, plan.page_size)
        f_fit = plan.fraction_for_headroom(plan.prefill_peak)
        fixes = [f"lower --chunked-prefill-size to {chunk}" if chunk else ""]
        fixes.append(f"lower --mem-fraction-static to {f_fit:.2f}" if f_fit else "")
        problems.append(PlanProblem(
            "activation", "prefill", False,
            f"A prefill chunk of {plan.prefill_chunk} tokens needs about "
            f"{fmt_bytes(plan.prefill_peak)} of activation memory; the activation pool has "
            f"{fmt_bytes(headroom)}: long prefills will run out of memory.",
            [x for x in fixes if x]))
    if not plan.decode_fits and plan.max_running_rule == "--max-running-requests":
        batch = plan.activation.max_decode_batch_within(headroom, plan.context_len,
                                                         plan.max_running_requests)
        f_fit = plan.fraction_for_headroom(plan.decode_peak)
        fixes = [f"lower --max-running-requests to {batch}" if batch else ""]
        fixes.append(f"lower --mem-fraction-static to {f_fit:.2f}" if f_fit else "")
        problems.append(PlanProblem(
            "activation", "decode", False,
            f"A decode step of {plan.max_running_requests} requests at full context needs "
            f"about {fmt_bytes(plan.decode_peak)} of activation memory; the activation pool "
            f"has {fmt_bytes(headroom)}.", [x for x in fixes if x]))
    problems.sort(key=lambda p: not p.fatal)
    return replace(plan, problems=problems)
