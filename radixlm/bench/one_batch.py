"""`radixlm bench one-batch`: prefill latency and decode step time of one static batch,
and how close decode comes to the memory-bandwidth roofline.

A decode step of batch B reads every weight once (matmuls are matrix-vector products at
small B, bound by memory) plus each request's whole K and V. Bytes per step:

    weights: what each linear method reads for B rows (a quantized method's 4/8-bit
             kernel bytes up to its row limit, its dense fallback's beyond), the B rows
             of the input embedding that are looked up, and the norms;
    KV:      B * seq_len * num_layers * 2 (K and V) * kv_heads * head_dim * element size,
             where seq_len = prompt_len + k at decode step k (1-based: the step that
             samples token k+1 attends over the prompt and k generated tokens).

More: docs/bench-tools.md, "bench/one_batch.py".
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from radixlm.bench.offline import greedy_params, prompt_vocab
from radixlm.bench.report import append_json_line, format_table, machine_info, utc_now
from radixlm.bench.threads import torch_threads
from radixlm.bench.workload import RandomWorkload, random_prompts
from radixlm.engine import Engine
from radixlm.models.linear.method import storage_key
from radixlm.models.linear.policy import method_storage_keys, top_level_methods
from radixlm.models.loader import resolve_model_path


@dataclass(frozen=True)
class OneBatchConfig:
    model: str | None = None
    dtype: str = "auto"
    batch_sizes: tuple[int, ...] = (1, 32)
    prompt_len: int = 128
    decode_steps: int = 16
    repeat: int = 1
    seed: int = 0
    copy_mib: int = 512  # size of the buffer copied to measure the bandwidth
    num_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    output_file: str | None = None
    engine_args: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError("--batch-sizes must be >= 1")
        if self.prompt_len < 1 or self.decode_steps < 1 or self.repeat < 1:
            raise ValueError("--prompt-len, --decode-steps and --repeat must be >= 1")


def measure_copy_bandwidth(nbytes: int, device: torch.device, tries: int = 5) -> float:
    """Bytes/s of `dst.copy_(src)` over `nbytes`-byte buffers, counting the read and the
    write (2 * nbytes per copy); the best of `tries` (noise only ever slows a copy)."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch: page faults are not bandwidth
    best = float("inf")
    for _ in range(tries):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * 4 / best


@dataclass(frozen=True)
class StepBytes:
    weights: int  # read per decode step, whatever the batch
    kv_per_token: int  # K + V bytes of one token position, all layers

    def decode_step(self, batch: int, seq_len: int) -> int:
        return self.weights + batch * seq_len * self.kv_per_token


def step_bytes(engine: Engine, batch: int) -> StepBytes:
    """Each linear method's bytes for a call of `batch` rows (a quantized method's kernel
    bytes, or its dense fallback's past its row limit; models/linear/), the input
    embedding's `batch` rows (all of it when a dense tied head reads it whole), and the
    other parameters (norms) whole."""
    runner = engine.scheduler.runner
    model = runner.model
    weights = sum(m.bytes_read(batch) for m in top_level_methods(model))
    in_methods = method_storage_keys(model)
    # radixlm's Llama: model.model.embed_tokens (a VocabParallelEmbedding, this rank's rows).
    emb = getattr(getattr(model, "model", model), "embed_tokens", None)
    emb_w = getattr(emb, "weight", None)
    for p in model.parameters():
        if storage_key(p) in in_methods:
            continue  # counted by its method (a dense tied head reads the embedding whole)
        if p is emb_w:
            weights += batch * p.shape[1] * p.element_size()  # a lookup of `batch` rows
        else:
            weights += p.numel() * p.element_size()
    kv = runner.token_to_kv_pool
    elem = torch.empty((), dtype=kv.dtype).element_size()
    return StepBytes(weights, kv.num_layers * 2 * kv.kv_heads * kv.head_dim * elem)


@dataclass(frozen=True)
class BatchRun:
    prefill_s: float
    decode_step_s: list[float]


def time_one_batch(engine: Engine, prompts: list[list[int]], decode_steps: int) -> BatchRun:
    """One prefill step over all prompts, then `decode_steps` decode steps, each timed."""
    rids = [engine.submit(p, greedy_params(decode_steps + 1)) for p in prompts]
    t0 = time.perf_counter()
    engine.step()
    prefill_s = time.perf_counter() - t0
    if engine.scheduler.waiting:
        raise RuntimeError("the batch did not fit in one prefill step (check --engine-arg)")
    steps = []
    while not all(engine.result(r)["finished"] for r in rids):
        t0 = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - t0)
    for rid in rids:
        engine.pop_result(rid)
    return BatchRun(prefill_s, steps)


def static_batch_args(batch: int, prompt_len: int, decode_steps: int) -> dict[str, Any]:
    """Engine arguments for timing static batches of up to `batch` prompts: each batch is
    one prefill step (chunking off) and never waits for KV slots (room for two batches: the
    previous one's slots may still be held by the radix cache); the serial loop (with the
    overlap loop a step() returns the results of the step before, which would shift every
    timing by one step)."""
    prefill = batch * prompt_len
    return {"max_running_requests": batch,
            "max_total_tokens": 2 * batch * (prompt_len + decode_steps + 2) + 256,
            "max_prefill_tokens": prefill, "chunked_prefill_size": prefill,
            "disable_overlap_schedule": True}


def interleaved_modes(engine: Engine, modes: dict[str, Callable[[], None]],
                      batch_sizes: list[int], rounds: int, prompt_len: int = 128,
                      decode_steps: int = 16) -> dict[tuple[int, str], list[BatchRun]]:
    """An in-engine A/B: per round and batch size, each mode (its setter called first)
    times one static batch (`time_one_batch`) of fresh prompts (their own per round, size
    and mode: no radix-cache hits), the modes' order reversed every other round so that a
    load trend favours none. {(batch size, mode): one BatchRun per round}."""
    vocab, excluded = prompt_vocab(engine)
    names = list(modes)
    runs: dict[tuple[int, str], list[BatchRun]] = {}
    for i in range(rounds):
        for bs in batch_sizes:
            for name in names if i % 2 == 0 else names[::-1]:
                modes[name]()
                w = RandomWorkload(bs, prompt_len, prompt_len, decode_steps,
                                   (1000 * i + bs) * len(names) + names.index(name))
                run = time_one_batch(engine, random_prompts(w, vocab, excluded), decode_steps)
                runs.setdefault((bs, name), []).append(run)
    return runs


def run_one_batch(cfg: OneBatchConfig, log=print) -> dict[str, Any]:
    cfg.validate()
    machine = machine_info()
    model_path = resolve_model_path(cfg.model)
    big = max(cfg.batch_sizes)
    with torch_threads(cfg.num_threads):
        args = {**static_batch_args(big, cfg.prompt_len, cfg.decode_steps), **cfg.engine_args}
        engine = Engine(model_path, dtype=cfg.dtype, **args)
        vocab, excluded = prompt_vocab(engine)
        warm = random_prompts(RandomWorkload(2, 16, 16, 2, seed=-1), vocab, excluded)
        engine.generate(warm, greedy_params(2))
        device = engine.scheduler.runner.device
        log(f"measuring copy bandwidth ({cfg.copy_mib} MiB buffers)")
        bandwidth = measure_copy_bandwidth(cfg.copy_mib << 20, device)
        runs: dict[int, list[BatchRun]] = {b: [] for b in cfg.batch_sizes}
        for i in range(cfg.repeat):
            for b in cfg.batch_sizes:  # interleaved over repeats
                w = RandomWorkload(b, cfg.prompt_len, cfg.prompt_len, cfg.decode_steps,
                                   cfg.seed + 1000 * i + b)
                run = time_one_batch(engine, random_prompts(w, vocab, excluded),
                                     cfg.decode_steps)
                runs[b].append(run)
                log(f"[{i + 1}/{cfg.repeat}] batch {b}: prefill {run.prefill_s:.3f} s, decode "
                    f"step median {statistics.median(run.decode_step_s) * 1e3:.1f} ms")
        engine.check_invariant()
        results = [_batch_result(engine, b, cfg, runs[b], bandwidth) for b in cfg.batch_sizes]
    record = {"benchmark": "one-batch", "timestamp": utc_now(), "machine": machine,
              "load_avg_1m_end": os.getloadavg()[0],
              "config": {**dataclasses.asdict(cfg), "model_path": model_path,
                         "resolved_dtype": str(engine.scheduler.runner.dtype)},
              "copy_bandwidth_gb_s": bandwidth / 1e9,
              "weights_on_huge_pages_mb": engine.scheduler.runner.huge_page_bytes / 1e6,
              "results": results}
    if cfg.output_file:
        append_json_line(cfg.output_file, record)
    return record


def _batch_result(engine: Engine, batch: int, cfg: OneBatchConfig, runs: list[BatchRun],
                  bandwidth: float) -> dict[str, Any]:
    sb = step_bytes(engine, batch)
    # Decode step k (1-based) attends over prompt_len + k positions of every request.
    per_step: list[float] = []  # achieved bytes/s of every decode step of every run
    step_times = []
    for run in runs:
        for k, t in enumerate(run.decode_step_s, start=1):
            per_step.append(sb.decode_step(batch, cfg.prompt_len + k) / t)
            step_times.append(t)
    mid_bytes = sb.decode_step(batch, cfg.prompt_len + (cfg.decode_steps + 1) // 2)
    achieved = statistics.median(per_step)
    prefill_s = statistics.median(r.prefill_s for r in runs)
    return {"batch_size": batch, "prefill_s": prefill_s,
            "prefill_tok_s": batch * cfg.prompt_len / prefill_s,
            "decode_step_ms": statistics.median(step_times) * 1e3,
            "decode_tok_s": batch / statistics.median(step_times),
            "weight_bytes_per_step": sb.weights, "kv_bytes_per_step_mid": mid_bytes - sb.weights,
            "achieved_gb_s": achieved / 1e9, "roofline_share": achieved / bandwidth,
            "runs": [dataclasses.asdict(r) for r in runs]}


def one_batch_table(record: dict[str, Any]) -> str:
    headers = ["batch", "prefill s", "prefill tok/s", "decode step ms", "decode tok/s",
               "weights MB", "KV MB", "achieved GB/s", "roofline share"]
    rows = [[r["batch_size"], r["prefill_s"], r["prefill_tok_s"], r["decode_step_ms"],
             r["decode_tok_s"], r["weight_bytes_per_step"] / 1e6,
             r["kv_bytes_per_step_mid"] / 1e6, r["achieved_gb_s"],
             f"{r['roofline_share']:.1%}"] for r in record["results"]]
    cfg = record["config"]
    return (format_table(headers, rows)
            + f"\n(prompt {cfg['prompt_len']} tokens, {cfg['decode_steps']} decode steps, median "
              f"of {cfg['repeat']}; KV MB at the middle decode step; measured copy bandwidth "
              f"{record['copy_bandwidth_gb_s']:.1f} GB/s; weights on huge pages "
              f"{record.get('weights_on_huge_pages_mb', 0):.0f} MB)")
