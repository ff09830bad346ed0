"""`radixlm bench dtype`: one-batch prefill + decode speed per dtype, through the Engine.

Justifies `--dtype auto`'s choice on the CPU (docs/benchmarks.md, "dtype on the CPU").
One engine per dtype is loaded up front; with `--repeat N` the dtypes are measured in
turn (f32, bf16, f16, f32, ...) so a noisy neighbour slows them alike, and each
figure is the median over the repeats.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from radixlm.bench.offline import greedy_params, prompt_vocab
from radixlm.bench.one_batch import time_one_batch
from radixlm.bench.report import append_json_line, format_table, machine_info, utc_now
from radixlm.bench.threads import torch_threads
from radixlm.bench.workload import RandomWorkload, random_prompts
from radixlm.engine import Engine
from radixlm.models.loader import resolve_model_path

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class DtypeBenchConfig:
    model: str | None = None
    dtypes: tuple[str, ...] = DTYPES
    batch_size: int = 8
    prompt_len: int = 128  # defaults keep one run under ~2 min on 2 cores
    decode_steps: int = 16
    repeat: int = 1
    seed: int = 0
    num_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    output_file: str | None = None
    engine_args: dict[str, Any] = field(default_factory=dict)  # other ServerArgs fields


@dataclass(frozen=True)
class BatchTiming:
    """One batch: a single prefill step over all prompts, then `decode_steps` decode steps."""

    prefill_s: float
    decode_s: float


def load_engine(cfg: DtypeBenchConfig, model_path: str, dtype: str) -> Engine:
    n = cfg.batch_size
    # Pools sized for exactly this batch; the whole batch is one prefill step (no chunking).
    args = {"max_running_requests": n,
            "max_total_tokens": n * (cfg.prompt_len + cfg.decode_steps + 1),
            "max_prefill_tokens": n * cfg.prompt_len,
            "chunked_prefill_size": n * cfg.prompt_len,
            # Serial loop: with overlap a step() returns the step before's results, so the
            # first step() would not contain the prefill's time.
            "disable_overlap_schedule": True, **cfg.engine_args}
    engine = Engine(model_path, dtype=dtype, **args)
    vocab, excluded = prompt_vocab(engine)
    engine.generate(random_prompts(RandomWorkload(2, 16, 16, 2, seed=-1), vocab, excluded),
                    greedy_params(2))  # warm-up
    return engine


def time_batch(engine: Engine, prompts: list[list[int]], decode_steps: int) -> BatchTiming:
    """`bench one-batch`'s timing of one prefill step + `decode_steps` decode steps."""
    run = time_one_batch(engine, prompts, decode_steps)
    return BatchTiming(run.prefill_s, sum(run.decode_step_s))


def run_dtype_bench(cfg: DtypeBenchConfig, log=print) -> dict[str, Any]:
    if cfg.repeat < 1:
        raise ValueError(f"--repeat must be >= 1, got {cfg.repeat}")
    model_path = resolve_model_path(cfg.model)
    machine = machine_info()
    with torch_threads(cfg.num_threads):
        engines, load_s = {}, {}
        for dtype in cfg.dtypes:
            log(f"loading {dtype} ...")
            t0 = time.perf_counter()
            engines[dtype] = load_engine(cfg, model_path, dtype)
            load_s[dtype] = time.perf_counter() - t0
        vocab, excluded = prompt_vocab(engines[cfg.dtypes[0]])
        timings: dict[str, list[BatchTiming]] = {d: [] for d in cfg.dtypes}
        for i in range(cfg.repeat):
            w = RandomWorkload(cfg.batch_size, cfg.prompt_len, cfg.prompt_len, cfg.decode_steps,
                               cfg.seed + i)
            prompts = random_prompts(w, vocab, excluded)
            for dtype in cfg.dtypes:
                t = time_batch(engines[dtype], prompts, cfg.decode_steps)
                timings[dtype].append(t)
                log(f"[{i + 1}/{cfg.repeat}] {dtype}: prefill {t.prefill_s:.2f} s, "
                    f"decode {t.decode_s:.2f} s")
    prefill_tokens = cfg.batch_size * cfg.prompt_len
    decode_tokens = cfg.batch_size * cfg.decode_steps
    results = []
    for dtype in cfg.dtypes:
        prefill_s = statistics.median(t.prefill_s for t in timings[dtype])
        decode_s = statistics.median(t.decode_s for t in timings[dtype])
        results.append({"dtype": dtype, "load_s": load_s[dtype],
                        "runs": [dataclasses.asdict(t) for t in timings[dtype]],
                        "median_prefill_s": prefill_s, "median_decode_s": decode_s,
                        "prefill_tok_s": prefill_tokens / prefill_s,
                        "decode_tok_s": decode_tokens / decode_s})
    record = {"benchmark": "dtype", "timestamp": utc_now(), "machine": machine,
              "load_avg_1m_end": os.getloadavg()[0],
              "config": {**dataclasses.asdict(cfg), "model_path": model_path},
              "prefill_tokens": prefill_tokens, "decode_tokens": decode_tokens,
              "results": results,
              "fastest_prefill": max(results, key=lambda r: r["prefill_tok_s"])["dtype"],
              "fastest_decode": max(results, key=lambda r: r["decode_tok_s"])["dtype"]}
    if cfg.output_file:
        append_json_line(cfg.output_file, record)
    return record


def dtype_table(record: dict[str, Any]) -> str:
    headers = ["dtype", "load s", "prefill s", "prefill tok/s", "decode s", "decode tok/s"]
    rows = [[r["dtype"], r["load_s"], r["median_prefill_s"], r["prefill_tok_s"],
             r["median_decode_s"], r["decode_tok_s"]] for r in record["results"]]
    n = record["config"]["repeat"]
    return (format_table(headers, rows)
            + f"\n(median of {n}; prefill {record['prefill_tokens']} tokens in one step, "
              f"decode {record['decode_tokens']} tokens)"
            + f"\nfastest: prefill {record['fastest_prefill']}, decode {record['fastest_decode']}")
