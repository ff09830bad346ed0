"""Prometheus metrics of one server: GET /metrics, in the text exposition format.

Each app owns an `EngineMetrics` with its own `CollectorRegistry` (no process-global
registry: tests and `--dp-size` start several apps in one process). Nothing is kept up to
date in the background: a scrape asks the scheduler for its PoolStats, takes a `Snapshot`
(the MemoryPlan from start-up, the live PoolStats, the TokenizerManager's counters) and
evaluates every `MetricDef` on it.

To add a metric, append a `MetricDef` to `ENGINE_METRICS` (or pass extra ones to
`EngineMetrics`): a name, a help text, "gauge" or "counter", and a function of the
Snapshot; return None when the value is unknown (e.g. no PoolStats) and it is left out.
Every metric carries the label `model_name`. Counters get Prometheus' `_total` suffix.
The routing gauges Kubernetes reads are also exported under vLLM's and SGLang's names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from radixlm.messages import PoolStats

__all__ = ["CONTENT_TYPE_LATEST", "ENGINE_METRICS", "EngineMetrics", "MetricDef", "Snapshot",
           "pool_field"]


@dataclass(frozen=True)
class Snapshot:
    plan: Any  # radixlm.planning.planner.MemoryPlan | None
    pool: PoolStats | None  # None when the scheduler did not answer in time
    requests_finished_total: int
    prompt_tokens_total: int
    generation_tokens_total: int
    max_running_requests: int | None


@dataclass(frozen=True)
class MetricDef:
    name: str
    doc: str
    kind: str  # "gauge" | "counter"
    value: Callable[[Snapshot], float | None]


def _plan(f: Callable[[Any], float]) -> Callable[[Snapshot], float | None]:
    return lambda s: None if s.plan is None else float(f(s.plan))


def _pool(f: Callable[[PoolStats], float]) -> Callable[[Snapshot], float | None]:
    return lambda s: None if s.pool is None else float(f(s.pool))


def _timing(key: str) -> Callable[[Snapshot], float | None]:
    return lambda s: (None if s.pool is None or s.pool.step_timing is None
                      else float(s.pool.step_timing[key]))


def pool_field(section: str, key: str) -> Callable[[Snapshot], float | None]:
    """`key` of the PoolStats section `section` (a dict: hicache, grammar, speculative);
    None when the scheduler did not answer, the section is off, or it lacks the key."""
    def value(s: Snapshot) -> float | None:
        d = None if s.pool is None else getattr(s.pool, section)
        return None if d is None or key not in d else float(d[key])
    return value


def _hicache_device_hits(s: Snapshot) -> float | None:
    if s.pool is None or s.pool.hicache is None:
        return None
    h = s.pool.hicache
    return float(s.pool.cached_tokens_total - h["hit_tokens_storage"] - h["hit_tokens_host"])


# --hierarchical cache (mem/hi_radix_cache.py); absent when it is off.
HICACHE_METRICS: list[MetricDef] = [
    MetricDef("radixlm_hicache_device_hit_tokens", "Prompt tokens served from the device KV "
              "pool at admission.", "counter", _hicache_device_hits),
    MetricDef("radixlm_hicache_storage_hit_tokens", "Prompt tokens loaded back from the "
              "storage tier.", "counter", pool_field("hicache", "hit_tokens_storage")),
    MetricDef("radixlm_hicache_host_hit_tokens", "Prompt tokens loaded back from the host "
              "tier (host memory).", "counter", pool_field("hicache", "hit_tokens_host")),
    MetricDef("radixlm_hicache_blocks_demoted", "Blocks queued for the tiers below when the "
              "device pool evicted them.", "counter", pool_field("hicache", "blocks_demoted")),
    MetricDef("radixlm_hicache_blocks_host_to_storage", "Blocks the host tier evicted to the "
              "storage tier.", "counter", pool_field("hicache", "blocks_host_to_storage")),
    MetricDef("radixlm_hicache_blocks_written_through", "Blocks queued for storage when "
              "their request finished (write-through).", "counter",
              pool_field("hicache", "blocks_written_through")),
    MetricDef("radixlm_hicache_blocks_written", "Blocks written to the tiers below (host, "
              "else storage).", "counter", pool_field("hicache", "blocks_written")),
    MetricDef("radixlm_hicache_blocks_loaded", "Blocks loaded (promoted) from the tiers below "
              "into the device pool.", "counter", pool_field("hicache", "blocks_loaded")),
    MetricDef("radixlm_hicache_blocks_loaded_host", "Of those, blocks loaded from host "
              "memory.", "counter", pool_field("hicache", "blocks_loaded_host")),
    MetricDef("radixlm_hicache_loads", "Load jobs completed.", "counter",
              pool_field("hicache", "loads")),
    MetricDef("radixlm_hicache_load_seconds", "Loader thread time of the load jobs (load "
              "latency = this / loads).", "counter", pool_field("hicache", "load_seconds")),
    MetricDef("radixlm_hicache_storage_bytes", "Bytes of the storage tier's files.", "gauge",
              pool_field("hicache", "storage_bytes")),
    MetricDef("radixlm_hicache_storage_capacity_bytes", "Bound of the storage tier.", "gauge",
              pool_field("hicache", "storage_capacity_bytes")),
    MetricDef("radixlm_hicache_host_bytes", "Bytes of the host tier's blocks.", "gauge",
              pool_field("hicache", "host_bytes")),
    MetricDef("radixlm_hicache_host_capacity_bytes", "Bound of the host tier (0: none).",
              "gauge", pool_field("hicache", "host_capacity_bytes")),
    MetricDef("radixlm_hicache_storage_bad_files_deleted", "Stored files found truncated, "
              "corrupted or foreign and deleted.", "counter",
              pool_field("hicache", "storage_bad_files_deleted")),
]


ENGINE_METRICS: list[MetricDef] = [
    # --- the three pools (plan) ---------------------------------------------------------
    MetricDef("radixlm_device_memory_bytes", "Device memory the plan was made for.", "gauge",
              _plan(lambda p: p.device_total)),
    MetricDef("radixlm_mem_fraction_static", "Share of the device for weights + KV cache.",
              "gauge", _plan(lambda p: p.mem_fraction_static)),
    MetricDef("radixlm_weight_bytes", "Weight pool: bytes of the loaded weights.", "gauge",
              _plan(lambda p: p.weight_bytes)),
    MetricDef("radixlm_kv_cache_bytes", "KV cache pool: bytes allocated for K and V.", "gauge",
              _plan(lambda p: p.kv_bytes)),
    MetricDef("radixlm_activation_headroom_bytes",
              "Activation pool: device memory left after weights, KV pool and req_to_token.",
              "gauge", _plan(lambda p: p.activation_headroom)),
    # --- the KV pool, live ----------------------------------------------------------------
    MetricDef("radixlm_kv_capacity_tokens", "KV cache pool size in tokens (slots).", "gauge",
              _pool(lambda s: s.total_kv_slots)),
    MetricDef("radixlm_kv_used_tokens", "KV slots held by running/waiting requests.", "gauge",
              _pool(lambda s: s.held_by_requests)),
    MetricDef("radixlm_kv_cached_tokens", "KV slots held by the radix cache.", "gauge",
              _pool(lambda s: s.held_by_cache)),
    MetricDef("radixlm_kv_free_tokens", "Free KV slots.", "gauge",
              _pool(lambda s: s.free_kv_slots)),
    MetricDef("radixlm_cache_hit_rate", "Prompt tokens served from the radix cache / prompt "
              "tokens, over all admissions.", "gauge", _pool(lambda s: s.cache_hit_rate)),
    # --- requests -------------------------------------------------------------------------
    MetricDef("radixlm_num_running_reqs", "Requests in the running batch.", "gauge",
              _pool(lambda s: s.running)),
    MetricDef("radixlm_num_queue_reqs", "Requests waiting to be admitted.", "gauge",
              _pool(lambda s: s.waiting)),
    MetricDef("radixlm_max_running_requests", "Limit on running requests.", "gauge",
              lambda s: None if s.max_running_requests is None else float(s.max_running_requests)),
    MetricDef("radixlm_scheduler_up", "1 if the scheduler answered this scrape.", "gauge",
              lambda s: float(s.pool is not None)),
    # --- scheduler step timing (overlap scheduler, StepTimer) ------------------------------
    MetricDef("radixlm_overlap_schedule", "1 if the overlap scheduler runs, 0 for the serial "
              "loop.", "gauge", _pool(lambda s: s.overlap)),
    MetricDef("radixlm_forward_steps", "Forwards run (batches).", "counter",
              _timing("forwards")),
    MetricDef("radixlm_forward_seconds", "Device busy time: forward + sampling of every batch.",
              "counter", _timing("forward_s")),
    MetricDef("radixlm_decode_forward_steps", "Decode forwards run (one token per request; "
              "speculative verifies and prefills not counted).", "counter",
              _timing("decode_forwards")),
    MetricDef("radixlm_decode_forward_seconds", "Device busy time of the decode forwards: "
              "over radixlm_decode_forward_steps, the mean decode step, to set beside the "
              "inter-token latency clients see.", "counter", _timing("decode_forward_s")),
    MetricDef("radixlm_bubble_seconds", "Device idle time between two forwards while work was "
              "pending (waiting for the CPU scheduler).", "counter", _timing("bubble_s")),
    MetricDef("radixlm_schedule_seconds", "Scheduler CPU time (receiving, building batches, "
              "processing results), not waiting for forwards.", "counter",
              _timing("schedule_s")),
    MetricDef("radixlm_bubble_share", "bubble / (forward + bubble) since start: the share of "
              "the busy device timeline lost waiting for the CPU.", "gauge",
              _timing("bubble_share")),
    MetricDef("radixlm_oom_splits", "Forwards that ran out of memory and were re-run in "
              "two halves.", "counter", _timing("oom_splits")),
    MetricDef("radixlm_oom_failed_requests", "Requests failed with the memory diagnosis: "
              "their forward ran out of memory even alone.", "counter",
              lambda s: (None if s.pool is None or s.pool.step_timing is None
                         else float(s.pool.step_timing.get("oom_failures", 0)))),
    # --- counters -------------------------------------------------------------------------
    MetricDef("radixlm_requests", "Finished requests (any finish reason or error).", "counter",
              lambda s: float(s.requests_finished_total)),
    MetricDef("radixlm_prompt_tokens", "Prompt tokens of finished requests.", "counter",
              lambda s: float(s.prompt_tokens_total)),
    MetricDef("radixlm_generation_tokens", "Generated tokens of finished requests.", "counter",
              lambda s: float(s.generation_tokens_total)),
    MetricDef("radixlm_cached_prompt_tokens", "Prompt tokens served from the radix cache at "
              "admission (scheduler side).", "counter", _pool(lambda s: s.cached_tokens_total)),
    # --- what Kubernetes routers read (docs/deploy.md): the Gateway API Inference
    # Extension's model-server protocol and llm-d, under vLLM's names and SGLang's ----------
    *(MetricDef(name, doc, "gauge", value) for names, doc, value in [
        (("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
         "Requests waiting to be admitted (TotalQueuedRequests).", _pool(lambda s: s.waiting)),
        (("vllm:num_requests_running", "sglang:num_running_reqs"),
         "Requests in the running batch (TotalRunningRequests).", _pool(lambda s: s.running)),
        (("vllm:kv_cache_usage_perc", "sglang:token_usage"),
         "KV slots held by requests / all KV slots, 0..1 (KVCacheUtilization; the radix "
         "cache's evictable slots count as free).",
         _pool(lambda s: s.held_by_requests / s.total_kv_slots if s.total_kv_slots else 0.0)),
    ] for name in names),
]


class EngineMetrics(Collector):
    """One server's metrics registry. `render(snapshot)` returns the exposition text."""

    def __init__(self, model_name: str, extra: Sequence[MetricDef] = ()) -> None:
        self.model_name = model_name
        self.defs = [*ENGINE_METRICS, *HICACHE_METRICS, *extra]
        self._snapshot: Snapshot | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot
        if snap is None:
            return
        for d in self.defs:
            value = d.value(snap)
            if value is None:
                continue
            family_cls = GaugeMetricFamily if d.kind == "gauge" else CounterMetricFamily
            family = family_cls(d.name, d.doc, labels=["model_name"])
            family.add_metric([self.model_name], value)
            yield family

    def render(self, snapshot: Snapshot) -> bytes:
        self._snapshot = snapshot
        try:
            return generate_latest(self.registry)
        finally:
            self._snapshot = None
