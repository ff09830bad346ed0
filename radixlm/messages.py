"""Dataclasses that cross process boundaries, grouped by destination.

API process  --TokenizedGenerateReq / AbortReq-->  scheduler
scheduler    --BatchTokenIDOut-->                  detokenizer
detokenizer  --BatchStrOut-->                      API process

They are plain dataclasses; `radixlm.ipc` is the one serializer (pickle over ZMQ). The
per-token ones (`@_per_token`: every request's output, every step) pickle as their
constructor's arguments in field order: a slotted dataclass's own pickling calls
`dataclasses.fields()` per object, which cost more than the detokenizer's decoding.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

_T = TypeVar("_T")


def _per_token(cls: type[_T]) -> type[_T]:
    """Pickle `cls` (a dataclass) as `cls(*fields in order)`: one C attrgetter call."""
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    get = operator.attrgetter(*names)
    if len(names) == 1:
        cls.__reduce__ = lambda self: (cls, (get(self),))  # type: ignore[assignment]
    else:
        cls.__reduce__ = lambda self: (cls, get(self))  # type: ignore[assignment]
    return cls

from radixlm.sampling_params import SamplingParams


# --- to the scheduler -------------------------------------------------------------


@dataclass(slots=True)
class TokenizedGenerateReq:
    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams
    stream: bool = False


@dataclass(slots=True)
class AbortReq:
    rid: str


@dataclass(slots=True)
class PoolStatsReq:
    """Ask the scheduler for its pool state; answered with PoolStats. Control replies
    (PoolStats, FlushCacheResult) pass through the detokenizer unchanged."""

    rid: str


@dataclass(slots=True)
class FlushCacheReq:
    """Empty the radix cache (`storage`: the hicache's storage tier too); refused while
    requests are running or waiting."""

    rid: str
    storage: bool = False


@dataclass(slots=True)
class FlushCacheResult:
    rid: str
    success: bool
    message: str


@dataclass(slots=True)
class DashboardReq:
    """Ask the scheduler for a DashboardSnapshot (scheduler/dashboard_probe.py), at most
    `max_nodes` radix nodes, `max_reqs` requests and the steps recorded after `since_seq`."""

    rid: str
    max_nodes: int = 200
    max_reqs: int = 64
    since_seq: int = 0


@dataclass(slots=True)
class DashboardSnapshot:
    rid: str
    data: dict[str, Any]


@dataclass(slots=True)
class PoolStats:
    rid: str
    total_kv_slots: int
    free_kv_slots: int
    held_by_requests: int
    held_by_cache: int
    running: int
    waiting: int
    free_req_rows: int
    # None when free + held by requests (+ cache) == total and no slot is listed twice.
    invariant_error: str | None = None
    page_size: int = 1  # KV slots are handed out in pages of this many
    # Prompt tokens of requests at their first admission, those served from the radix
    # cache, and cached / prompt (0.0 before any request).
    prompt_tokens_total: int = 0
    cached_tokens_total: int = 0
    cache_hit_rate: float = 0.0
    # Scheduler step timing (StepTimer.as_dict(): forwards, forward_s, bubble_s,
    # schedule_s, bubble_share) and whether the overlap loop runs.
    step_timing: dict[str, float] | None = None
    overlap: bool = False
    # Constrained decoding counters (GrammarStats.as_dict()); None before the first
    # constrained request.
    grammar: dict[str, float] | None = None
    # Speculative decoding counters (SpecStats.as_dict(): algorithm, drafted, accepted,
    # accept_hist, ...); None when --speculative-algorithm is off.
    speculative: dict | None = None
    # Hierarchical cache counters and tier sizes (HiRadixCache.tier_stats()); None when off.
    hicache: dict[str, Any] | None = None
    # Decode graphs (DecodeGraphRunner.stats(): kind, batch_sizes, ready, capturing,
    # replays, error); None without CUDA graphs or --enable-torch-compile.
    decode_graphs: dict[str, Any] | None = None


# --- to the detokenizer -----------------------------------------------------------


@_per_token
@dataclass(slots=True)
class TokenLogprob:
    """Log-probability of the chosen token at one position, and the top alternatives."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass(slots=True)
class PromptLogprobs:
    """The prompt tokens' logprobs (vLLM's prompt_logprobs), as flat lists: entry i is
    prompt token s + i + 1 given tokens 0..s + i (s: the request's logprob_start_len, 0 by
    default; the first prompt token has none). `top_ids[i]` /
    `top_values[i]` are its top alternatives (both empty when none were asked for)."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)  # 1: the most likely token
    top_ids: list[list[int]] = field(default_factory=list)
    top_values: list[list[float]] = field(default_factory=list)


@_per_token
@dataclass(slots=True)
class ReqTokenOut:
    """New tokens of one request since its previous ReqTokenOut."""

    rid: str
    new_token_ids: list[int]
    # Set on the last message of a request: "stop" | "length" | "abort".
    finish_reason: str | None = None
    # The stop string that ended the request (it is cut from the text), or the stop
    # token id; None otherwise.
    matched_stop: str | int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None
    # Sent once, complete, on the request's first message (None otherwise).
    prompt_logprobs: PromptLogprobs | None = None
    skip_special_tokens: bool = True
    # Keep the matched stop string at the end of the text (vLLM's include_stop_str_in_output).
    include_stop_str: bool = False
    # Characters to hold back while streaming so a stop string is never half-sent.
    stop_hold_chars: int = 0
    error: str | None = None
    # The HTTP status the error maps to (None: 500), e.g. 507 for a lone request whose
    # forward ran out of memory.
    error_status: int | None = None


@_per_token
@dataclass(slots=True)
class BatchTokenIDOut:
    outs: list[ReqTokenOut]


# --- to the API process ------------------------------------------------------------


@_per_token
@dataclass(slots=True)
class ReqStrOut:
    rid: str
    text_delta: str
    token_ids_delta: list[int]
    finish_reason: str | None = None
    matched_stop: str | int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None
    error: str | None = None
    error_status: int | None = None  # as ReqTokenOut.error_status
    prompt_logprobs: PromptLogprobs | None = None  # as ReqTokenOut.prompt_logprobs


@_per_token
@dataclass(slots=True)
class BatchStrOut:
    outs: list[ReqStrOut]


@dataclass(slots=True)
class SchedulerReady:
    """Sent once by the scheduler after the model is loaded and the pools exist."""

    max_total_tokens: int
    max_running_requests: int
    context_len: int
    vocab_size: int
    # The MemoryPlan the pools were allocated from (radixlm.planning.planner; /get_server_info
    # and /metrics show it). None from engines that do not plan.
    memory_plan: Any = None
    # Decode batch sizes replayed from CUDA graphs (None: graphs off).
    cuda_graph_batch_sizes: list[int] | None = None
    # The run dtype (e.g. "bfloat16") and why --dtype gave it; the scheduler's torch
    # intra-op thread count. /get_server_info shows them.
    dtype: str | None = None
    dtype_reason: str | None = None
    num_threads: int | None = None


@dataclass(slots=True)
class SchedulerFailed:
    error: str
