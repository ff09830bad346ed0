"""Routing benchmark: the same engine instances behind `cache_aware` and `round_robin`
routers, side by side in one run, on a generated-shared-prefix workload.

    python -m radixlm.bench.routing [--num-instances 2] [--repeat 3] ...

Starts N instances (`radixlm serve`, default model unless --model) once, and one router
per policy over all of them (`radixlm router`). For each repeat the policies take turns
on the same requests (interleaved, so a noisy neighbour slows them alike); before each
run the router flushes every instance's cache (and its own trees). Reported per policy,
the median over repeats: the cache hit rate the instances counted (prompt tokens served
from the radix cache / prompt tokens, from /server_info before and after), throughput and
latency from the load generator of `radixlm bench serve`, and the ratios of the first
policy over the second.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from typing import Any

from radixlm.bench.cli import parse_engine_arg
from radixlm.bench.datasets import DatasetArgs, TokenPool, to_text
from radixlm.bench.report import format_table
from radixlm.bench.serve import bench_one
from radixlm.bench.serve_client import Target
from radixlm.bench.serve_load import LoadConfig
from radixlm.bench.server_proc import LaunchedServer, ServerSpec, radixlm_spec
from radixlm.bench.cold_start import free_port

FIELDS = ("server_cache_hit_rate", "cache_hit_rate", "output_throughput", "total_throughput",
          "request_throughput", "median_ttft_ms", "median_e2e_latency_ms", "duration")


def router_spec(policy: str, worker_urls: list[str]) -> ServerSpec:
    port = free_port()
    cmd = [sys.executable, "-m", "radixlm", "router", "--port", str(port), "--policy", policy,
           "--log-level", "warning", "--worker-urls", *worker_urls]
    return ServerSpec(policy, tuple(cmd), port, "radixlm")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m radixlm.bench.routing",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="Default: the SmolLM2-135M GGUF.")
    p.add_argument("--num-instances", type=int, default=2)
    p.add_argument("--policies", nargs="+", default=["cache_aware", "round_robin"])
    p.add_argument("--gsp-num-groups", type=int, default=9,
                   help="Odd by default: with an even count, round_robin over 2 instances "
                   "would send every group to one instance by accident (the dataset "
                   "interleaves groups g0q0, g1q0, ...).")
    p.add_argument("--gsp-prompts-per-group", type=int, default=4)
    p.add_argument("--gsp-system-prompt-len", type=int, default=256)
    p.add_argument("--gsp-question-len", type=int, default=32)
    p.add_argument("--gsp-output-len", type=int, default=16)
    p.add_argument("--max-concurrency", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engine-arg", type=parse_engine_arg, action="append", default=[],
                   metavar="KEY=VALUE", help="ServerArgs field for every instance.")
    p.add_argument("--output-file", default=None, help="Append one JSON line per run.")
    return p


def summarize(records: list[dict[str, Any]], policies: list[str]) -> tuple[str, dict[str, float]]:
    rows, med = [], {}
    for pol in policies:
        recs = [r for r in records if r["policy"] == pol]
        med[pol] = {f: statistics.median(r[f] for r in recs if r.get(f) is not None)
                    for f in FIELDS if any(r.get(f) is not None for r in recs)}
        m = med[pol]
        rows.append([pol, f"{sum(r['completed'] for r in recs)}/{sum(r['failed'] for r in recs)}",
                     f"{m.get('server_cache_hit_rate', 0):.1%}", f"{m.get('cache_hit_rate', 0):.1%}",
                     m["request_throughput"], m["output_throughput"], m["total_throughput"],
                     m["median_ttft_ms"], m["median_e2e_latency_ms"]])
    table = format_table(["policy", "ok/fail", "hit (server)", "hit (usage)", "req/s",
                          "out tok/s", "total tok/s", "TTFT med ms", "E2E med ms"], rows)
    a, b = policies[0], policies[1] if len(policies) > 1 else policies[0]
    ratios = {f"{f} {a}/{b}": med[a][f] / med[b][f] for f in
              ("server_cache_hit_rate", "total_throughput", "request_throughput")
              if med[b].get(f)}
    return table, ratios


def shared_prefix_dataset(ns: argparse.Namespace) -> DatasetArgs:
    """The generated-shared-prefix workload of this command's --gsp-* flags."""
    return DatasetArgs(name="generated-shared-prefix", gsp_num_groups=ns.gsp_num_groups,
                       gsp_prompts_per_group=ns.gsp_prompts_per_group,
                       gsp_system_prompt_len=ns.gsp_system_prompt_len,
                       gsp_question_len=ns.gsp_question_len,
                       gsp_output_len=ns.gsp_output_len, seed=ns.seed)


def main(argv: list[str] | None = None) -> None:
    from radixlm.models.loader import resolve_model_path
    from radixlm.tokenizer.loader import load_tokenizer

    ns = build_parser().parse_args(argv)
    engine_args = dict(ns.engine_arg)
    tokenizer = load_tokenizer(resolve_model_path(ns.model))
    dataset = shared_prefix_dataset(ns)
    pool = TokenPool.from_tokenizer(tokenizer)
    records: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        urls = []
        for i in range(ns.num_instances):
            spec = radixlm_spec(f"instance{i}", ns.model, engine_args)
            print(f"starting {spec.name}: {' '.join(spec.cmd)}", flush=True)
            stack.enter_context(LaunchedServer(spec))
            urls.append(spec.base_url)
        targets = []
        for pol in ns.policies:
            spec = router_spec(pol, urls)
            stack.enter_context(LaunchedServer(spec, timeout_s=60))
            targets.append(Target(pol, spec.base_url, "radixlm"))
        for r in range(ns.repeat):
            requests = to_text(dataset.build(tokenizer, pool, seed_offset=r), tokenizer)
            load = LoadConfig(max_concurrency=ns.max_concurrency, seed=ns.seed + r,
                              show_progress=False)
            order = targets if r % 2 == 0 else targets[::-1]  # alternate who goes first
            for target in order:
                t0 = time.perf_counter()
                m = asyncio.run(bench_one(target, requests, load, tokenizer, num_warmup=1))
                m.pop("details")
                rec = {"policy": target.name, "repeat": r, **m}
                records.append(rec)
                print(f"[repeat {r + 1}/{ns.repeat}] {target.name}: hit "
                      f"{m.get('server_cache_hit_rate', 0):.1%}, {m['total_throughput']:.0f} "
                      f"tok/s total, {m['completed']} ok / {m['failed']} failed "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
                if ns.output_file:
                    with open(ns.output_file, "a") as f:
                        f.write(json.dumps({"benchmark": "routing", "args": vars(ns) | {
                            "engine_arg": engine_args}, **rec}, default=str) + "\n")
    table, ratios = summarize(records, ns.policies)
    print(table)
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}x")


if __name__ == "__main__":
    main()
