"""`radixlm bench offline`: in-process throughput of radixlm vs transformers `generate`.

Both engines run in this process on the same prompts, weights, dtype and thread count,
interleaved (radixlm, baseline, radixlm, baseline, ...) so that a noisy neighbour slows
both alike. Repeat i uses the workload seed `seed + i`: identical prompts in a later
repeat would be served from a prefix cache and measure the cache, not the engine.
"""

from __future__ import annotations

import contextlib
import cProfile
import dataclasses
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from radixlm.bench.datasets import SharedPrefixDataset, TokenPool
from radixlm.bench.engine_args import Ablation
from radixlm.bench.hf_baseline import HFBaseline
from radixlm.bench.report import (Throughput, append_json_line, format_table, machine_info,
                                  summarize, utc_now)
from radixlm.bench.threads import torch_threads
from radixlm.bench.workload import RandomWorkload, random_prompts, special_token_ids
from radixlm.engine import Engine
from radixlm.models.loader import resolve_model_path
from radixlm.sampling_params import SamplingParams

BASELINES = ("transformers", "none")


@dataclass(frozen=True)
class OfflineConfig:
    model: str | None = None
    dtype: str = "auto"
    workload: RandomWorkload = field(default_factory=RandomWorkload)
    max_running_requests: int = 64
    max_total_tokens: int = 65536
    max_prefill_tokens: int = 8192
    repeat: int = 1
    baseline: str = "transformers"
    baseline_batch_size: int | None = None  # None: max_running_requests
    num_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    output_file: str | None = None
    profile_file: str | None = None  # cProfile stats of the timed radixlm runs
    engine_args: dict[str, Any] = field(default_factory=dict)  # other ServerArgs fields
    # When set, the prompts come from this dataset instead of `workload`.
    shared_prefix: SharedPrefixDataset | None = None
    ablations: tuple[Ablation, ...] = ()  # more radixlm engines, measured side by side

    def validate(self) -> None:
        self.workload.validate()
        if self.shared_prefix is not None:
            self.shared_prefix.validate()
        names = ["radixlm", "transformers", *(a.name for a in self.ablations)]
        if len(set(names)) != len(names):
            raise ValueError(f"engine names must be unique, got {names}")
        if self.repeat < 1:
            raise ValueError(f"--repeat must be >= 1, got {self.repeat}")
        if self.baseline not in BASELINES:
            raise ValueError(f"--baseline must be one of {BASELINES}, got {self.baseline!r}")


def greedy_params(output_len: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=output_len, temperature=0.0, ignore_eos=True)


def prompt_vocab(engine: Engine) -> tuple[int, set[int]]:
    """(ids to draw from = range(n), excluded ids). The embedding may be padded past the
    tokenizer's vocabulary; ids beyond the tokenizer are not real tokens."""
    n = min(engine.scheduler.runner.vocab_size, len(engine.tokenizer))
    return n, special_token_ids(engine.tokenizer)


Outputs = list[list[int]]  # token ids per request (prompts have the same shape)


def run_radixlm(engine: Engine, prompts: Outputs, output_len: int) -> tuple[Throughput, Outputs]:
    throughput, outs, _ = run_radixlm_cached(engine, prompts, output_len)
    return throughput, outs


def run_radixlm_cached(engine: Engine, prompts: Outputs,
                       output_len: int) -> tuple[Throughput, Outputs, float]:
    """Also the run's cache hit rate: cached prompt tokens / prompt tokens, as the
    scheduler reported them per request (`meta_info.cached_tokens`)."""
    t0 = time.perf_counter()
    results = engine.generate(prompts, greedy_params(output_len))
    wall = time.perf_counter() - t0
    outs = [r["output_ids"] for r in results]
    cached = sum(r["meta_info"]["cached_tokens"] for r in results)
    hit_rate = cached / max(1, sum(map(len, prompts)))
    return (Throughput(len(prompts), sum(map(len, prompts)), sum(map(len, outs)), wall), outs,
            hit_rate)


def workload_prompts(cfg: OfflineConfig, repeat: int, vocab: int,
                     excluded: set[int]) -> tuple[Outputs, int]:
    """Repeat `repeat`'s prompts (seed + repeat) and their output length."""
    if cfg.shared_prefix is not None:
        ds = dataclasses.replace(cfg.shared_prefix, seed=cfg.shared_prefix.seed + repeat)
        reqs = ds.generate(TokenPool.from_vocab(vocab, excluded))
        return [list(r.prompt) for r in reqs], ds.output_len
    w = cfg.workload
    return (random_prompts(dataclasses.replace(w, seed=w.seed + repeat), vocab, excluded),
            w.output_len)


def run_baseline(baseline: HFBaseline, prompts: Outputs,
                 output_len: int) -> tuple[Throughput, Outputs]:
    t0 = time.perf_counter()
    outs = baseline.generate(prompts, output_len)
    wall = time.perf_counter() - t0
    return Throughput(len(prompts), sum(map(len, prompts)), sum(map(len, outs)), wall), outs


def greedy_agreement(a: Outputs, b: Outputs) -> float:
    """Mean fraction of each output that both engines agree on before first diverging.
    Greedy decoding of the same weights should agree until a near-tie in the logits
    flips (batch shapes change the float rounding), then the sequences drift apart."""
    fractions = []
    for x, y in zip(a, b):
        same = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
        fractions.append(same / max(len(x), len(y), 1))
    return statistics.fmean(fractions) if fractions else 1.0


def run_offline(cfg: OfflineConfig, log=print) -> dict[str, Any]:
    """Run the benchmark; return (and optionally append to cfg.output_file) its record."""
    cfg.validate()
    with torch_threads(cfg.num_threads):
        record = _measure(cfg, log)
    if cfg.output_file:
        append_json_line(cfg.output_file, record)
    return record


def _measure(cfg: OfflineConfig, log) -> dict[str, Any]:
    machine = machine_info()
    model_path = resolve_model_path(cfg.model)
    engines: dict[str, Engine] = {}
    for name, extra in [("radixlm", {}), *((a.name, a.engine_args) for a in cfg.ablations)]:
        args = {"max_running_requests": cfg.max_running_requests,
                "max_total_tokens": cfg.max_total_tokens,
                "max_prefill_tokens": cfg.max_prefill_tokens, **cfg.engine_args, **extra}
        log(f"loading radixlm engine {name!r} ({model_path}, dtype={cfg.dtype}, {extra})")
        engines[name] = Engine(model_path, dtype=cfg.dtype, **args)
    engine = engines["radixlm"]
    dtype = engine.scheduler.runner.dtype
    baseline = None
    batch_size = cfg.baseline_batch_size or cfg.max_running_requests
    if cfg.baseline == "transformers":
        log(f"loading transformers baseline (dtype={dtype}, batch size {batch_size})")
        baseline = HFBaseline(model_path, dtype, batch_size)
    vocab, excluded = prompt_vocab(engine)

    # Warm-up: first calls allocate buffers and pick kernels; keep that out of the timing.
    warm = random_prompts(RandomWorkload(2, 8, 16, 4, seed=-1), vocab, excluded)
    for e in engines.values():
        run_radixlm(e, warm, 4)
    if baseline is not None:
        run_baseline(baseline, warm, 4)

    profiler = cProfile.Profile() if cfg.profile_file else None
    runs: dict[str, list[Throughput]] = {name: [] for name in engines}
    hit_rates: dict[str, list[float]] = {name: [] for name in engines}
    theirs: list[Throughput] = []
    agreement: list[float] = []
    for i in range(cfg.repeat):
        prompts, output_len = workload_prompts(cfg, i, vocab, excluded)
        r_out: Outputs = []
        # Interleaved: every engine runs repeat i before any runs repeat i + 1.
        for name, e in engines.items():
            profiled = profiler is not None and name == "radixlm"
            with profiler if profiled else contextlib.nullcontext():
                r, outs, hit = run_radixlm_cached(e, prompts, output_len)
            runs[name].append(r)
            hit_rates[name].append(hit)
            r_out = outs if name == "radixlm" else r_out
            log(f"[{i + 1}/{cfg.repeat}] {name + ':':13s} {_figures(r)}  cache hit {hit:.1%}")
        if baseline is not None:
            b, b_out = run_baseline(baseline, prompts, output_len)
            theirs.append(b)
            agreement.append(greedy_agreement(r_out, b_out))
            log(f"[{i + 1}/{cfg.repeat}] transformers: {_figures(b)}")
    for e in engines.values():
        e.check_invariant()
    if profiler is not None:
        profiler.dump_stats(cfg.profile_file)
        log(f"cProfile of the radixlm runs: {cfg.profile_file} (python -m pstats)")

    record: dict[str, Any] = {
        "benchmark": "offline", "timestamp": utc_now(), "machine": machine,
        "load_avg_1m_end": os.getloadavg()[0],
        "config": {**dataclasses.asdict(cfg), "model_path": model_path,
                   "resolved_dtype": str(dtype),
                   "baseline_batch_size": batch_size if baseline is not None else None,
                   "torch_threads": torch.get_num_threads()},
        "engines": list(engines) + (["transformers"] if baseline is not None else []),
    }
    for name in engines:
        record[name] = {**summarize(runs[name]), "cache_hit_rates": hit_rates[name],
                        "median_cache_hit_rate": statistics.median(hit_rates[name])}
    if baseline is not None:
        record["transformers"] = summarize(theirs)
        record["ratio_output_tok_s"] = (record["radixlm"]["median_output_tok_s"]
                                        / record["transformers"]["median_output_tok_s"])
        record["greedy_agreement"] = statistics.fmean(agreement)
    return record


def _figures(t: Throughput) -> str:
    return f"{t.wall_s:7.1f} s  {t.output_tok_s:8.1f} out tok/s"


def offline_table(record: dict[str, Any]) -> str:
    headers = ["engine", "requests", "input tok", "output tok", "wall s", "out tok/s",
               "total tok/s", "cache hit", "vs radixlm"]
    rows = []
    names = record.get("engines", ["radixlm", "transformers"])
    ref = record["radixlm"]["median_output_tok_s"]
    for name in names:
        if name not in record:
            continue
        s = record[name]
        first = s["runs"][0]
        hit = s.get("median_cache_hit_rate")
        rows.append([name, first["requests"], first["input_tokens"], first["output_tokens"],
                     s["median_wall_s"], s["median_output_tok_s"], s["median_total_tok_s"],
                     "-" if hit is None else f"{hit:.1%}",
                     f"{s['median_output_tok_s'] / ref:.2f}x"])
    text = format_table(headers, rows)
    n = len(record["radixlm"]["runs"])
    text += f"\n(median of {n} run{'s' if n > 1 else ''}; token counts of run 1)"
    if "ratio_output_tok_s" in record:
        text += (f"\nradixlm / transformers output tok/s: {record['ratio_output_tok_s']:.2f}x"
                 f"   greedy agreement: {record['greedy_agreement']:.0%}")
    return text
