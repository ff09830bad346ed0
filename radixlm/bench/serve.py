"""`radixlm bench serve`: the serving benchmark, against a running server or peers it starts.

With `--base-url` it measures that one server (any OpenAI-compatible one). Without, it
starts the servers itself and measures them side by side in one run: radixlm (with any
`--engine-arg`s), one radixlm per `--ablation`, and llama-server on the same GGUF when
one is found (`--llama-server PATH`, `llama-server` on PATH, or the binary that
scripts/build_llama_server.sh builds). For each repeat and each `--max-concurrency` value
the servers take turns on the same requests (interleaved, so a noisy neighbour slows them
alike), and the summary takes medians. Repeat r uses dataset seed `seed + r`.

Every measured run starts from empty prefix caches: radixlm is flushed (`POST
/flush_cache`) after its warm-up; llama-server, which has no such endpoint (its host-RAM
prompt cache survives a slot erase), is restarted before the run. The warm-up request
is request 0's token ids reversed, so it caches no prefix of the workload.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from radixlm.bench.engine_args import Ablation
from radixlm.bench.datasets import BenchRequest, DatasetArgs, TokenPool, to_text
from radixlm.bench.report import append_json_line, format_table, machine_info, utc_now
from radixlm.bench.serve_client import Target, model_name, send_request
from radixlm.bench.serve_load import LoadConfig, run_load
from radixlm.bench.serve_metrics import compute_metrics
from radixlm.bench.hf_baseline import HFBaseline
from radixlm.bench.proc_stats import cpu_delta, cpu_ms_per_token, cpu_seconds, server_processes
from radixlm.bench.server_proc import (LaunchedServer, ServerSpec, find_llama_server,
                                       llama_server_spec, radixlm_spec)
from radixlm.bench.serve_hf import BASELINE_NAME, resolve_baseline_dtype, run_hf_requests


@dataclass(frozen=True)
class ServeBenchConfig:
    dataset: DatasetArgs = field(default_factory=DatasetArgs)
    request_rate: float = math.inf
    max_concurrency: tuple[int | None, ...] = (None,)
    num_warmup: int = 1
    repeat: int = 1
    base_url: str | None = None  # None: start the servers below
    server_pid: int | None = None  # with base_url: its pid, for CPU seconds per process
    stream: bool = True  # False: unary requests (--disable-stream)
    # Merged into every request's body (--extra-request-body): not for the transformers
    # baseline, which always decodes greedily.
    extra_request_body: dict[str, Any] | None = None
    backend: str = "openai"
    api_key: str | None = None
    model: str | None = None  # weights of started servers; the tokenizer of the dataset
    tokenizer: str | None = None
    engine_args: dict[str, Any] = field(default_factory=dict)
    ablations: tuple[Ablation, ...] = ()
    llama_server: str | None = None  # a path; "none" = do not run it
    llama_server_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    # "none", or the dtype of an in-process transformers `generate` run on the same
    # requests after the servers (bench/serve_hf.py; "auto": its best dtype on this CPU).
    transformers_baseline: str = "none"
    startup_timeout_s: float = 600.0
    output_file: str | None = None
    output_details: bool = False  # per-request ttfts/itls/latencies in the JSON lines
    show_progress: bool = True

    def validate(self) -> None:
        if self.repeat < 1:
            raise ValueError(f"--repeat must be >= 1, got {self.repeat}")
        if self.backend not in ("openai", "radixlm"):
            raise ValueError(f"--backend must be openai or radixlm, got {self.backend!r}")
        if self.base_url and self.ablations:
            raise ValueError("--ablation starts its own servers: drop --base-url")
        for c in self.max_concurrency:
            LoadConfig(max_concurrency=c, request_rate=self.request_rate).validate()
        if self.transformers_baseline != "none":
            resolve_baseline_dtype(self.transformers_baseline)
            if self.extra_request_body:
                raise ValueError("--extra-request-body does not apply to the transformers "
                                 "baseline (greedy): drop one of them")


def load_bench_tokenizer(cfg: ServeBenchConfig) -> Any:
    from radixlm.models.loader import resolve_model_path
    from radixlm.tokenizer.loader import load_tokenizer

    return load_tokenizer(resolve_model_path(cfg.model), cfg.tokenizer)


def build_requests(cfg: ServeBenchConfig, tokenizer: Any, repeat: int) -> list[BenchRequest]:
    pool = TokenPool.from_tokenizer(tokenizer)
    return to_text(cfg.dataset.build(tokenizer, pool, seed_offset=repeat), tokenizer)


def server_specs(cfg: ServeBenchConfig, requests: list[BenchRequest],
                 log=print) -> list[ServerSpec]:
    """radixlm, its ablations, and llama-server if one is found."""
    from radixlm.models.loader import resolve_model_path

    specs = [radixlm_spec("radixlm", cfg.model, cfg.engine_args)]
    for ab in cfg.ablations:
        specs.append(radixlm_spec(ab.name, cfg.model, {**cfg.engine_args, **ab.engine_args}))
    if cfg.llama_server != "none":
        binary = find_llama_server(cfg.llama_server)
        model_path = resolve_model_path(cfg.model)
        if binary is None:
            log("llama-server: not found (--llama-server PATH, or scripts/"
                "build_llama_server.sh); skipped")
        elif not model_path.endswith(".gguf"):
            log(f"llama-server: {model_path} is not a GGUF file; skipped")
        else:
            parallel = max([c for c in cfg.max_concurrency if c] or [len(requests)])
            specs.append(llama_server_spec(binary, model_path, min(parallel, len(requests)),
                                           slot_context(requests), cfg.llama_server_threads))
    return specs


def slot_context(requests: list[BenchRequest]) -> int:
    """Tokens one llama-server slot must hold: the longest request, with every turn of a
    conversation (answer + follow-up), plus a margin for tokenizer differences, rounded
    up to 256."""
    longest = max(r.prompt_len + (1 + len(r.follow_ups)) * r.output_len
                  + len(r.follow_ups) * (r.prompt_len // 4 + 64) for r in requests)
    return -(-(longest + 64) // 256) * 256


async def _flush_cache(client: httpx.AsyncClient, target: Target) -> None:
    """POST /flush_cache, retried while the server still finishes (refuses) requests."""
    for _ in range(50):
        r = await client.post(target.base_url + "/flush_cache", headers=target.headers(),
                              timeout=60)
        if r.status_code == 200:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{target.name}: /flush_cache kept failing: {r.text}")


async def _server_pool(client: httpx.AsyncClient, target: Target) -> dict[str, Any] | None:
    r = await client.get(target.base_url + "/server_info", headers=target.headers(), timeout=60)
    return r.json().get("pool") if r.status_code == 200 else None


async def bench_one(target: Target, requests: list[BenchRequest], load: LoadConfig,
                    tokenizer: Any, num_warmup: int,
                    server_pid: int | None = None) -> dict[str, Any]:
    """Warm up, (radixlm: flush the cache), run the load; the metrics and details, and,
    given the server's pid, the CPU seconds each of its processes and this client used
    during the load (`cpu_s`: where a CPU's time went)."""
    def count(text: str) -> int:  # prompt tokens of a later turn of a conversation
        return len(tokenizer.encode(text, add_special_tokens=False))

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits, timeout=None) as client:
        if target.model is None:
            target = dataclasses.replace(target, model=await model_name(client, target))
        warm = requests[0]
        # Request 0's token ids reversed: the same size, but no prefix of the workload, so a
        # server that cannot be flushed (llama-server, restarted before the run instead)
        # does not start the run with request 0 cached.
        warm_ids = (list(warm.prompt) if isinstance(warm.prompt, list)
                    else tokenizer.encode(warm.prompt, add_special_tokens=False))[::-1]
        for res in await asyncio.gather(*(send_request(client, target, warm_ids,
                                                       len(warm_ids), min(warm.output_len, 4))
                                          for _ in range(num_warmup))):
            if not res.success:
                raise RuntimeError(f"{target.name}: warm-up request failed: {res.error}")
        pool_before = None
        if target.backend == "radixlm":
            await _flush_cache(client, target)
            pool_before = await _server_pool(client, target)
        procs = server_processes(server_pid) if server_pid else {}
        cpu_before, client_before = cpu_seconds(procs), time.process_time()
        results, duration = await run_load(client, target, requests, load, count)
        cpu = {**cpu_delta(cpu_before, cpu_seconds(procs)),
               "client": round(time.process_time() - client_before, 3)} if procs else None
        pool_after = await _server_pool(client, target) if target.backend == "radixlm" else None
    metrics = compute_metrics(results, duration)
    errors = sorted({r.error for r in results if not r.success})
    details = {"success": [r.success for r in results],
               "input_lens": [r.prompt_len for r in results],
               "output_lens": [r.output_len for r in results],
               "ttfts": [r.ttft for r in results], "itls": [r.itl for r in results],
               "e2e_latencies": [r.latency for r in results], "errors": errors}
    # CPU ms per generated token in each process: what the HTTP path costs per token.
    per_token = cpu_ms_per_token(cpu, metrics["total_output_tokens"]) if cpu else None
    extra: dict[str, Any] = {"model_id": target.model, "errors": errors[:5], "cpu_s": cpu,
                             "cpu_ms_per_token": per_token, "stream": target.stream,
                             "extra_request_body": target.extra_body}
    if pool_before is not None and pool_after is not None:
        # The scheduler's own count over this run (it counts in tokens it tokenized).
        prompt = pool_after["prompt_tokens_total"] - pool_before["prompt_tokens_total"]
        cached = pool_after["cached_tokens_total"] - pool_before["cached_tokens_total"]
        extra["server_cache_hit_rate"] = cached / prompt if prompt else 0.0
        step_ms = _decode_step_ms(pool_before, pool_after)
        if step_ms is not None:
            # The server's own mean decode forward over this run, beside the ITL clients
            # saw: what the HTTP path and scheduling add per token.
            extra["decode_step_ms"] = step_ms
            extra["itl_over_decode_step"] = metrics["median_itl_ms"] / step_ms
    return {**metrics, **extra, "details": details}


def _decode_step_ms(before: dict[str, Any], after: dict[str, Any]) -> float | None:
    """Mean decode forward (ms) between two /server_info pool snapshots; None without
    decode steps (or from a server that does not count them)."""
    t0, t1 = before.get("step_timing") or {}, after.get("step_timing") or {}
    steps = t1.get("decode_forwards", 0) - t0.get("decode_forwards", 0)
    if steps <= 0:
        return None
    return 1000.0 * (t1["decode_forward_s"] - t0["decode_forward_s"]) / steps


def run_serve_bench(cfg: ServeBenchConfig, log=print) -> list[dict[str, Any]]:
    """Every run's record (one per server x concurrency x repeat), in the order run."""
    cfg.validate()
    machine = machine_info()
    tokenizer = load_bench_tokenizer(cfg)
    all_requests = [build_requests(cfg, tokenizer, r) for r in range(cfg.repeat)]
    with contextlib.ExitStack() as stack:
        if cfg.base_url:
            targets = [Target("server", cfg.base_url.rstrip("/"), cfg.backend,
                              api_key=cfg.api_key, stream=cfg.stream,
                              extra_body=cfg.extra_request_body)]
        else:
            targets, launched = [], {}
            for spec in server_specs(cfg, all_requests[0], log):
                log(f"starting {spec.name}: {' '.join(spec.cmd)}")
                launched[spec.name] = stack.enter_context(LaunchedServer(spec, cfg.startup_timeout_s))
                targets.append(Target(spec.name, spec.base_url, spec.backend,
                                      stream=cfg.stream, extra_body=cfg.extra_request_body))
        hf = _hf_baseline(cfg, log)
        records = []
        for r, requests in enumerate(all_requests):
            for conc in cfg.max_concurrency:
                load = LoadConfig(cfg.request_rate, conc, cfg.dataset.seed + r, cfg.show_progress)
                for target in targets:
                    server = None if cfg.base_url else launched[target.name]
                    if server is not None and server.spec.restart_to_flush:
                        server.restart()  # every run starts with empty caches
                    t0 = time.perf_counter()
                    m = asyncio.run(bench_one(target, requests, load, tokenizer, cfg.num_warmup,
                                              server.proc.pid if server else cfg.server_pid))
                    rec = _record(cfg, target, conc, r, m, machine)
                    records.append(rec)
                    cpu = ", ".join(f"{k} {v:.1f} ({m['cpu_ms_per_token'].get(k, 0):.2f} ms/tok)"
                                    for k, v in (m["cpu_s"] or {}).items())
                    step = (f" (decode step {m['decode_step_ms']:.1f} ms)"
                            if "decode_step_ms" in m else "")
                    log(f"[repeat {r + 1}/{cfg.repeat}, concurrency {conc or 'inf'}] "
                        f"{target.name}: {m['output_throughput']:.1f} out tok/s, "
                        f"median TTFT {m['median_ttft_ms']:.0f} ms, median ITL "
                        f"{m['median_itl_ms']:.1f} ms{step} ({time.perf_counter() - t0:.0f} s"
                        + (f"; CPU s over {m['duration']:.1f} s: {cpu}" if cpu else "") + ")")
                    _append(cfg, rec)
                if hf is not None:  # the servers are idle meanwhile
                    m = run_hf_requests(hf, requests, tokenizer, conc)
                    target = Target(BASELINE_NAME, "", "in-process")
                    rec = _record(cfg, target, conc, r, m, machine)
                    records.append(rec)
                    log(f"[repeat {r + 1}/{cfg.repeat}, concurrency {conc or 'inf'}] "
                        f"{m['model_id']} generate: {m['output_throughput']:.1f} out tok/s "
                        f"({m['duration']:.0f} s)")
                    _append(cfg, rec)
    return records


def _hf_baseline(cfg: ServeBenchConfig, log) -> HFBaseline | None:
    if cfg.transformers_baseline == "none":
        return None
    from radixlm.models.loader import resolve_model_path

    dtype = resolve_baseline_dtype(cfg.transformers_baseline)
    log(f"loading the transformers baseline ({dtype})")
    return HFBaseline(resolve_model_path(cfg.model), dtype, batch_size=1)


def _append(cfg: ServeBenchConfig, rec: dict[str, Any]) -> None:
    if cfg.output_file:
        line = rec if cfg.output_details else {k: v for k, v in rec.items() if k != "details"}
        append_json_line(cfg.output_file, line)


def _record(cfg: ServeBenchConfig, target: Target, conc: int | None, repeat: int,
            m: dict[str, Any], machine: dict[str, Any]) -> dict[str, Any]:
    ds = asdict(cfg.dataset)
    return {"benchmark": "serve", "timestamp": utc_now(), "machine": machine,
            "load_avg_1m_end": os.getloadavg()[0], "server": target.name,
            "backend": target.backend, "base_url": target.base_url,
            "dataset_name": cfg.dataset.name, "dataset": ds,
            "request_rate": "inf" if math.isinf(cfg.request_rate) else cfg.request_rate,
            "max_concurrency": conc, "repeat_index": repeat,
            "num_prompts": len(m["details"]["input_lens"]),  # every turn counts
            "engine_args": _server_args(cfg, target.name),
            **m}


def _server_args(cfg: ServeBenchConfig, name: str) -> dict[str, Any] | None:
    if cfg.base_url or name in ("llama-server", BASELINE_NAME):
        return None
    extra = next((a.engine_args for a in cfg.ablations if a.name == name), {})
    return {**cfg.engine_args, **extra}


SUMMARY_FIELDS = ("request_throughput", "output_throughput", "total_throughput",
                  "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms",
                  "median_tpot_ms", "median_e2e_latency_ms", "cache_hit_rate")


def summarize_runs(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (server, concurrency): the median of each field over the repeats, and
    the output throughput relative to the first server at the same concurrency."""
    groups: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for rec in records:
        groups.setdefault((rec["server"], rec["max_concurrency"]), []).append(rec)
    rows = []
    for (server, conc), recs in groups.items():
        row: dict[str, Any] = {"server": server, "max_concurrency": conc, "runs": len(recs),
                               "completed": recs[0]["completed"], "failed": recs[0]["failed"]}
        for f in SUMMARY_FIELDS:
            vals = [r[f] for r in recs if r.get(f) is not None]
            row[f] = statistics.median(vals) if vals else None
        rows.append(row)
    for row in rows:
        ref = next(r for r in rows if r["max_concurrency"] == row["max_concurrency"])
        row["output_throughput_ratio"] = row["output_throughput"] / ref["output_throughput"] \
            if ref["output_throughput"] else None
    return rows


def serve_table(records: list[dict[str, Any]]) -> str:
    rows = summarize_runs(records)
    headers = ["server", "conc", "ok/fail", "req/s", "out tok/s", "ratio", "TTFT med ms",
               "TTFT p99 ms", "ITL med ms", "ITL p99 ms", "TPOT med ms", "E2E med ms",
               "cache hit"]
    table = [[r["server"], r["max_concurrency"] or "inf", f"{r['completed']}/{r['failed']}",
              r["request_throughput"], r["output_throughput"],
              f"{r['output_throughput_ratio']:.2f}x", r["median_ttft_ms"], r["p99_ttft_ms"],
              r["median_itl_ms"], r["p99_itl_ms"], r["median_tpot_ms"],
              r["median_e2e_latency_ms"],
              "-" if r["cache_hit_rate"] is None else f"{r['cache_hit_rate']:.1%}"]
             for r in rows]
    n = max(r["runs"] for r in rows)
    return format_table(headers, table) + (f"\n(median of {n} runs each; ratio: output tok/s "
                                           f"over the first server's)" if n > 1 else "")
