"""`radixlm bench overlap`: the overlap scheduler vs the serial loop, side by side.

Two in-process engines on the same weights, one with the overlap scheduler (default) and
one with `--disable-overlap-schedule`, run the same prompts alternately (on, off, off, on,
...: a noisy neighbour slows both alike), `repeat` times with the workload seed `seed + i`
(fresh prompts, so no run is served from the other's cache). For each run: output
throughput, and from the scheduler's StepTimer the device timeline: forward time, the
bubble (device idle between forwards while work was pending) as a share of wall time, and
the scheduler's CPU time per step. Medians and the on/off throughput ratio are reported.

Workloads: `decode` (many concurrent short prompts, long outputs: steady decode, where the
bubble matters most) and `mixed` (prompt lengths spread over a wide range, chunked
prefills interleaved with decodes).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from radixlm.bench.report import append_json_line, machine_info, utc_now
from radixlm.bench.threads import torch_threads
from radixlm.bench.workload import RandomWorkload, random_prompts, special_token_ids
from radixlm.engine import Engine
from radixlm.executor.forward_worker import StepTimer
from radixlm.sampling_params import SamplingParams

WORKLOADS = {
    # 64 concurrent requests, short prompts, 256 output tokens (issue 5's decode workload).
    "decode": RandomWorkload(num_prompts=64, input_len_min=16, input_len_max=48,
                             output_len=256),
    "mixed": RandomWorkload(num_prompts=32, input_len_min=32, input_len_max=1024,
                            output_len=64),
}


@dataclass(frozen=True)
class OverlapBenchConfig:
    model: str | None = None
    workload: str = "decode"
    num_prompts: int | None = None  # None: the workload's
    output_len: int | None = None
    repeat: int = 3
    seed: int = 0
    num_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    engine_args: dict[str, Any] = field(default_factory=dict)
    output_file: str | None = None

    def resolved_workload(self, repeat_index: int) -> RandomWorkload:
        w = WORKLOADS[self.workload]
        return RandomWorkload(num_prompts=self.num_prompts or w.num_prompts,
                              input_len_min=w.input_len_min, input_len_max=w.input_len_max,
                              output_len=self.output_len or w.output_len,
                              seed=self.seed + repeat_index)


def _one_run(engine: Engine, prompts: list[list[int]], output_len: int) -> dict[str, float]:
    sched = engine.scheduler
    sched.worker.timer = timer = StepTimer()
    params = SamplingParams(max_new_tokens=output_len, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params)
    wall = time.perf_counter() - t0
    errors = {o["meta_info"]["error"] for o in outs if o["meta_info"].get("error")}
    if errors:
        raise RuntimeError(f"requests failed: {sorted(errors)[:3]}")
    tokens = sum(len(o["output_ids"]) for o in outs)
    engine.check_invariant()
    return {"wall_s": wall, "output_tokens": tokens, "output_tok_s": tokens / wall,
            "forwards": timer.forwards, "forward_s": timer.forward_s,
            "bubble_s": timer.bubble_s, "bubble_share_of_wall": timer.bubble_s / wall,
            "schedule_ms_per_step": 1000 * timer.schedule_s / max(timer.forwards, 1),
            "forward_ms_per_step": 1000 * timer.forward_s / max(timer.forwards, 1)}


def run_overlap_bench(cfg: OverlapBenchConfig) -> dict[str, Any]:
    if cfg.workload not in WORKLOADS:
        raise ValueError(f"--workload must be one of {sorted(WORKLOADS)}, got {cfg.workload!r}")
    if cfg.repeat < 1:
        raise ValueError(f"--repeat must be >= 1, got {cfg.repeat}")
    with torch_threads(cfg.num_threads):
        engines = {"overlap": Engine(model=cfg.model, disable_overlap_schedule=False,
                                     **cfg.engine_args),
                   "serial": Engine(model=cfg.model, disable_overlap_schedule=True,
                                    **cfg.engine_args)}
        first = engines["overlap"]
        vocab = min(first.scheduler.runner.vocab_size, len(first.tokenizer))
        excluded = special_token_ids(first.tokenizer)
        for eng in engines.values():  # warm-up: first-call allocations, thread start
            eng.generate([[100 + i] * 8 for i in range(4)],
                         SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True))
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
        for i in range(cfg.repeat):
            w = cfg.resolved_workload(i)
            prompts = random_prompts(w, vocab, excluded)
            order = list(engines) if i % 2 == 0 else list(reversed(engines))
            for name in order:
                runs[name].append(_one_run(engines[name], prompts, w.output_len))
        for eng in engines.values():
            eng.scheduler.shutdown()
    record: dict[str, Any] = {"bench": "overlap", "date": utc_now(), "machine": machine_info(),
                              "model": cfg.model or "default", "workload": cfg.workload,
                              "workload_params": vars(cfg.resolved_workload(0)),
                              "repeat": cfg.repeat, "engine_args": cfg.engine_args}
    for name, rs in runs.items():
        record[name] = {"runs": rs, **{f"median_{k}": statistics.median(r[k] for r in rs)
                                       for k in rs[0]}}
    ratios = [on["output_tok_s"] / off["output_tok_s"]
              for on, off in zip(runs["overlap"], runs["serial"])]
    record["throughput_ratio_median"] = statistics.median(ratios)
    record["throughput_ratios"] = ratios
    if cfg.output_file:
        append_json_line(cfg.output_file, record)
    return record


def overlap_table(record: dict[str, Any]) -> str:
    rows = [("", "output tok/s", "bubble % wall", "sched ms/step", "fwd ms/step", "steps")]
    for name in ("overlap", "serial"):
        r = record[name]
        rows.append((name, f"{r['median_output_tok_s']:.1f}",
                     f"{100 * r['median_bubble_share_of_wall']:.2f}",
                     f"{r['median_schedule_ms_per_step']:.2f}",
                     f"{r['median_forward_ms_per_step']:.2f}", f"{r['median_forwards']:.0f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    lines.append(f"overlap / serial throughput: {record['throughput_ratio_median']:.3f}x "
                 f"(median of {record['repeat']}: "
                 + ", ".join(f"{x:.3f}" for x in record["throughput_ratios"]) + ")")
    return "\n".join(lines)
