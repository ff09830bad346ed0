"""`radixlm bench long-prompt`: inter-token latency of running streams while a long prompt
arrives -- what chunked prefill is for.

Per configuration (a set of ServerArgs, e.g. chunked prefill on vs `chunked_prefill_size=-1`)
one in-process Engine: `num_streams` requests start decoding; after `warm_steps` decode
steps a prompt of `long_prompt_len` tokens arrives; stepping goes on until the long prompt
has produced its first token plus `tail_steps` more steps. Every stream token is time-
stamped when `Engine.step()` returns it (what a client would see, minus the HTTP hop).

An ITL sample is the gap between two consecutive tokens of one stream. "during" = the
samples that end after the long prompt arrived and no later than `tail_steps` steps after
its first token (they cover the whole prefill of the long prompt); "before" = the samples
of the warm steps. Configurations run in turn, `repeat` rounds, medians over rounds.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from radixlm.bench.engine_args import Ablation
from radixlm.bench.offline import prompt_vocab
from radixlm.bench.report import append_json_line, format_table, machine_info, utc_now
from radixlm.bench.threads import torch_threads
from radixlm.bench.workload import RandomWorkload, random_prompts
from radixlm.engine import Engine
from radixlm.models.loader import resolve_model_path
from radixlm.sampling_params import SamplingParams

DEFAULT_CONFIGS = (Ablation("chunked (default)", {}),
                   Ablation("no-chunk", {"chunked_prefill_size": -1}))


@dataclass(frozen=True)
class LongPromptConfig:
    model: str | None = None
    configs: tuple[Ablation, ...] = DEFAULT_CONFIGS
    num_streams: int = 8
    stream_prompt_len: int = 64
    long_prompt_len: int = 2048
    warm_steps: int = 8
    tail_steps: int = 4
    repeat: int = 1
    seed: int = 0
    num_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    output_file: str | None = None
    engine_args: dict[str, Any] = field(default_factory=dict)  # shared by every config

    def validate(self) -> None:
        if min(self.num_streams, self.stream_prompt_len, self.long_prompt_len,
               self.warm_steps, self.repeat) < 1 or self.tail_steps < 0:
            raise ValueError("long-prompt sizes must be >= 1 (--tail-steps >= 0)")
        names = [c.name for c in self.configs]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"need distinct configuration names, got {names}")


@dataclass
class Timeline:
    """Token arrival times (s, from the first stream's submission) of one round."""

    stream_tokens: list[list[float]]  # per stream, the time of each of its tokens
    long_arrival: float
    long_first_token: float
    window_end: float  # tail_steps steps after long_first_token

    def gaps(self) -> list[tuple[float, float]]:
        """(end time, gap) of every ITL sample of every stream."""
        return [(b, b - a) for ts in self.stream_tokens for a, b in zip(ts, ts[1:])]


def run_round(engine: Engine, cfg: LongPromptConfig, streams: list[list[int]],
              long_prompt: list[int]) -> Timeline:
    # Streams are aborted at the end of the window; they must not finish before it. The
    # long prompt's prefill takes at most one decode step per chunk, and chunks below 8
    # tokens are not a setting anyone uses. (Asking for the whole context instead would
    # make the KV budget reserve room for it and delay the long prompt's admission.)
    n_out = cfg.warm_steps + cfg.tail_steps + cfg.long_prompt_len // 8 + 16
    stream_params = SamplingParams(max_new_tokens=n_out, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    rids = [engine.submit(p, stream_params, stream=True) for p in streams]
    times: dict[str, list[float]] = {r: [] for r in rids}

    def step() -> list[Any]:
        outs = engine.step()
        now = time.perf_counter() - t0
        for o in outs:
            if o.rid in times:
                times[o.rid].extend([now] * max(1, len(o.token_ids_delta)))
        return outs

    while any(not ts for ts in times.values()):  # every stream prefilled
        step()
    for _ in range(cfg.warm_steps):
        step()
    long_arrival = time.perf_counter() - t0
    long_rid = engine.submit(long_prompt, SamplingParams(max_new_tokens=cfg.tail_steps + 1,
                                                         temperature=0.0, ignore_eos=True))
    while not engine.result(long_rid)["output_ids"]:
        step()
    long_first = time.perf_counter() - t0
    for _ in range(cfg.tail_steps):
        step()
    window_end = time.perf_counter() - t0
    for r in rids:
        engine.abort(r)
    engine.run_until_done([*rids, long_rid])
    for r in [*rids, long_rid]:
        engine.pop_result(r)
    return Timeline([times[r] for r in rids], long_arrival, long_first, window_end)


def summarize_round(t: Timeline) -> dict[str, float]:
    gaps = t.gaps()
    before = [g for end, g in gaps if end <= t.long_arrival]
    during = [g for end, g in gaps if t.long_arrival < end <= t.window_end]
    ms = lambda xs, f: float(f(np.asarray(xs) * 1e3)) if xs else float("nan")  # noqa: E731
    return {"itl_before_median_ms": ms(before, np.median),
            "itl_during_median_ms": ms(during, np.median),
            "itl_during_p99_ms": ms(during, lambda a: np.percentile(a, 99)),
            "itl_during_max_ms": ms(during, np.max),
            "itl_during_samples": len(during),
            "long_prompt_ttft_s": t.long_first_token - t.long_arrival}


def run_long_prompt(cfg: LongPromptConfig, log=print) -> dict[str, Any]:
    cfg.validate()
    machine = machine_info()
    model_path = resolve_model_path(cfg.model)
    with torch_threads(cfg.num_threads):
        engines = {}
        for c in cfg.configs:
            log(f"loading engine {c.name!r} ({c.engine_args})")
            args = {"max_running_requests": cfg.num_streams + 1, **cfg.engine_args,
                    **c.engine_args}
            engines[c.name] = Engine(model_path, **args)
        vocab, excluded = prompt_vocab(next(iter(engines.values())))
        for e in engines.values():  # warm-up
            e.generate(random_prompts(RandomWorkload(2, 16, 16, 2, seed=-1), vocab, excluded),
                       SamplingParams(max_new_tokens=2, temperature=0.0))
        rounds: dict[str, list[dict[str, float]]] = {c.name: [] for c in cfg.configs}
        timelines: dict[str, Timeline] = {}
        for i in range(cfg.repeat):
            seed = cfg.seed + i  # fresh prompts per round: no cache hits across rounds
            streams = random_prompts(RandomWorkload(cfg.num_streams, cfg.stream_prompt_len,
                                                    cfg.stream_prompt_len, 1, seed), vocab,
                                     excluded)
            (long_prompt,) = random_prompts(RandomWorkload(1, cfg.long_prompt_len,
                                                           cfg.long_prompt_len, 1, seed + 7919),
                                            vocab, excluded)
            for name, e in engines.items():
                t = run_round(e, cfg, streams, long_prompt)
                s = summarize_round(t)
                rounds[name].append(s)
                timelines[name] = t  # the last round's, for the plot
                log(f"[{i + 1}/{cfg.repeat}] {name}: ITL during median "
                    f"{s['itl_during_median_ms']:.0f} ms, p99 {s['itl_during_p99_ms']:.0f} ms, "
                    f"long-prompt TTFT {s['long_prompt_ttft_s']:.1f} s")
        for e in engines.values():
            e.check_invariant()
    results = []
    for c in cfg.configs:
        row: dict[str, Any] = {"config": c.name, "engine_args": c.engine_args,
                               "rounds": rounds[c.name]}
        for key in rounds[c.name][0]:
            row[key] = statistics.median(r[key] for r in rounds[c.name])
        results.append(row)
    record = {"benchmark": "long-prompt", "timestamp": utc_now(), "machine": machine,
              "load_avg_1m_end": os.getloadavg()[0],
              "config": {**dataclasses.asdict(cfg), "model_path": model_path},
              "results": results}
    if cfg.output_file:
        append_json_line(cfg.output_file, record)
    record["_timelines"] = timelines  # not JSON: for --plot
    return record


def long_prompt_table(record: dict[str, Any]) -> str:
    headers = ["config", "ITL before med ms", "ITL during med ms", "ITL during p99 ms",
               "ITL during max ms", "samples", "long TTFT s"]
    rows = [[r["config"], r["itl_before_median_ms"], r["itl_during_median_ms"],
             r["itl_during_p99_ms"], r["itl_during_max_ms"], r["itl_during_samples"],
             r["long_prompt_ttft_s"]] for r in record["results"]]
    cfg = record["config"]
    return (format_table(headers, rows)
            + f"\n({cfg['num_streams']} streams of {cfg['stream_prompt_len']}-token prompts; a "
              f"{cfg['long_prompt_len']}-token prompt arrives after {cfg['warm_steps']} decode "
              f"steps; median of {cfg['repeat']} rounds)")


def timeline_series(record: dict[str, Any]) -> tuple[dict, dict]:
    """(series, marks) for plots.plot_timeline from the last round of each config."""
    series, marks = {}, {}
    for name, t in record["_timelines"].items():
        pts = sorted(t.gaps())
        series[name] = ([e for e, _ in pts], [g * 1e3 for _, g in pts])
        marks[name] = (t.long_arrival, t.long_first_token)
    return series, marks
