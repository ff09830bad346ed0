"""`radixlm bench dashboard`: what open /dashboard pages cost a loaded server.

One radixlm server, one workload (the serve benchmark's random dataset, `--max-concurrency`
streams), run with 0 and with N pages watching (`--pages`, each a client reading
/dashboard/events, as a browser does), alternately (0, N, N, 0, ...: a noisy neighbour slows
both alike), `--repeat` times. Each run starts from a flushed cache (serve's `bench_one`).
Reported per run: output throughput, the CPU seconds of each server process, the updates
the pages received and the scheduler's snapshot time per update; then the medians and the
with/without throughput ratio. The load average is recorded beside every run.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from radixlm.bench.datasets import DatasetArgs
from radixlm.bench.report import append_json_line, format_table, machine_info, utc_now
from radixlm.bench.serve import ServeBenchConfig, bench_one, build_requests, load_bench_tokenizer
from radixlm.bench.serve_client import Target
from radixlm.bench.serve_load import LoadConfig
from radixlm.bench.server_proc import LaunchedServer, radixlm_spec


@dataclass(frozen=True)
class DashboardBenchConfig:
    model: str | None = None
    pages: int = 3
    max_concurrency: int = 32
    num_prompts: int = 96
    input_len: int = 128
    output_len: int = 64
    repeat: int = 3
    seed: int = 0
    engine_args: dict[str, Any] = field(default_factory=dict)
    output_file: str | None = None
    startup_timeout_s: float = 600.0


@dataclass
class PageStats:
    updates: int = 0
    build_ms: list[float] = field(default_factory=list)
    bytes: int = 0


async def watch(url: str, stats: PageStats) -> None:
    """Read /dashboard/events as a page does, until cancelled."""
    async with httpx.AsyncClient(timeout=None) as client:
        async with client.stream("GET", url + "/dashboard/events") as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                stats.bytes += len(line) + 1
                if line.startswith("data: "):
                    update = json.loads(line[6:])
                    stats.updates += 1
                    if update.get("sched"):
                        stats.build_ms.append(update["sched"]["build_ms"])


async def run_with_pages(target: Target, requests: list, load: LoadConfig, tokenizer: Any,
                         pages: int, pid: int) -> dict[str, Any]:
    stats = [PageStats() for _ in range(pages)]
    tasks = [asyncio.create_task(watch(target.base_url, s)) for s in stats]
    try:
        await asyncio.sleep(0.5 if pages else 0.0)  # the pages are connected and polling
        load_before = os.getloadavg()
        m = await bench_one(target, requests, load, tokenizer, 1, pid)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    build = [b for s in stats for b in s.build_ms]
    return {"pages": pages, "output_throughput": m["output_throughput"],
            "duration": m["duration"], "completed": m["completed"],
            "median_ttft_ms": m["median_ttft_ms"], "median_itl_ms": m["median_itl_ms"],
            "cpu_s": m["cpu_s"], "errors": m["errors"],
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "updates_per_page": [s.updates for s in stats],
            "kib_per_page": [round(s.bytes / 1024, 1) for s in stats],
            "snapshot_ms_median": statistics.median(build) if build else None,
            "snapshot_ms_max": max(build) if build else None}


def run_dashboard_bench(cfg: DashboardBenchConfig, log=print) -> dict[str, Any]:
    serve_cfg = ServeBenchConfig(
        dataset=DatasetArgs(num_prompts=cfg.num_prompts, random_input_len=cfg.input_len,
                            random_output_len=cfg.output_len, seed=cfg.seed),
        model=cfg.model, backend="radixlm")
    tokenizer = load_bench_tokenizer(serve_cfg)
    spec = radixlm_spec("radixlm", cfg.model, cfg.engine_args)
    runs: list[dict[str, Any]] = []
    log(f"starting {' '.join(spec.cmd)}")
    with LaunchedServer(spec, cfg.startup_timeout_s) as server:
        target = Target("radixlm", spec.base_url, "radixlm")
        for r in range(cfg.repeat):
            requests = build_requests(serve_cfg, tokenizer, r)
            load = LoadConfig(max_concurrency=cfg.max_concurrency, seed=cfg.seed + r,
                              show_progress=False)
            order = (0, cfg.pages) if r % 2 == 0 else (cfg.pages, 0)
            for pages in order:
                t0 = time.perf_counter()
                run = asyncio.run(run_with_pages(target, requests, load, tokenizer, pages,
                                                 server.proc.pid))
                run["repeat"] = r
                runs.append(run)
                log(f"[repeat {r + 1}/{cfg.repeat}] {pages} pages: "
                    f"{run['output_throughput']:.1f} out tok/s, {run['completed']} done, "
                    f"updates/page {run['updates_per_page']}, snapshot median "
                    f"{run['snapshot_ms_median']} ms, load {run['loadavg_before']} "
                    f"({time.perf_counter() - t0:.0f} s)")
    summary = summarize(runs, cfg.pages)
    record = {"bench": "dashboard", "date": utc_now(), "machine": machine_info(),
              "config": {k: v for k, v in cfg.__dict__.items() if k != "output_file"},
              "runs": runs, "summary": summary}
    if cfg.output_file:
        append_json_line(cfg.output_file, record)
    return record


def summarize(runs: list[dict[str, Any]], pages: int) -> dict[str, Any]:
    def med(n: int, key: str) -> float:
        return statistics.median(r[key] for r in runs if r["pages"] == n)
    off, on = med(0, "output_throughput"), med(pages, "output_throughput")
    pairs = [on_r["output_throughput"] / off_r["output_throughput"]
             for off_r, on_r in zip([r for r in runs if r["pages"] == 0],
                                    [r for r in runs if r["pages"] == pages])]
    return {"median_tok_s_0_pages": off, f"median_tok_s_{pages}_pages": on,
            "ratio_of_medians": on / off, "per_repeat_ratios": pairs,
            "difference_pct": 100 * (on - off) / off}


def dashboard_table(record: dict[str, Any]) -> str:
    rows = [[r["repeat"], r["pages"], f"{r['output_throughput']:.1f}",
             f"{r['median_itl_ms']:.0f}", r["updates_per_page"],
             r["snapshot_ms_median"] and f"{r['snapshot_ms_median']:.2f}",
             (r["cpu_s"] or {}).get("api"), r["loadavg_before"][0]] for r in record["runs"]]
    s = record["summary"]
    table = format_table(["repeat", "pages", "out tok/s", "median ITL ms", "updates/page",
                          "snapshot ms", "API CPU s", "load 1m"], rows)
    return (table + f"\nmedian ratio (pages / none): {s['ratio_of_medians']:.4f} "
            f"({s['difference_pct']:+.2f}%), per repeat: "
            + ", ".join(f"{x:.4f}" for x in s["per_repeat_ratios"]))
