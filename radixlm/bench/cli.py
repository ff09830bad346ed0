"""`radixlm bench serve | offline | one-batch | long-prompt | dtype | cold-start`: argparse
wiring only; the work is elsewhere."""

from __future__ import annotations

import argparse
import json
import os
import sys

from radixlm.bench.cli_args import add_ablation_arg, add_dataset_args
from radixlm.bench.datasets import DatasetArgs
from radixlm.bench.engine_args import parse_ablation, parse_engine_arg  # noqa: F401
from radixlm.bench.report import load_warning
from radixlm.bench.sglang_flags import BACKENDS, add_host_port_args
from radixlm.config import ServerArgs

_DTYPE_CHOICES = ["auto", "float32", "bfloat16", "float16"]
_DEFAULTS = ServerArgs()


def _add_engine_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine-arg", type=parse_engine_arg, action="append", default=[],
                   metavar="KEY=VALUE", help="Any other ServerArgs field for the radixlm "
                   "engine, e.g. chunked_prefill_size=-1 (repeatable).")


def _print_with_warning(table, record: dict) -> None:
    print(table(record))
    if (warning := load_warning(record)) is not None:
        print(warning)


def _offline(ns: argparse.Namespace) -> None:
    from radixlm.bench.offline import OfflineConfig, offline_table, run_offline
    from radixlm.bench.workload import RandomWorkload

    cfg = OfflineConfig(
        model=ns.model, dtype=ns.dtype,
        workload=RandomWorkload(ns.num_prompts, ns.input_len_min, ns.input_len_max,
                                ns.output_len, ns.seed),
        max_running_requests=ns.max_running_requests, max_total_tokens=ns.max_total_tokens,
        max_prefill_tokens=ns.max_prefill_tokens, repeat=ns.repeat, baseline=ns.baseline,
        baseline_batch_size=ns.baseline_batch_size, num_threads=ns.num_threads,
        output_file=ns.output_file, profile_file=ns.profile, engine_args=dict(ns.engine_arg),
        shared_prefix=_shared_prefix(ns), ablations=tuple(ns.ablation))
    record = run_offline(cfg)
    _print_with_warning(offline_table, record)
    if ns.plot:
        from radixlm.bench.plots import plot_bars

        names = [n for n in record["engines"]]
        print("wrote " + plot_bars(names, [record[n]["median_output_tok_s"] for n in names],
                                   "output tokens/s (median)", f"bench offline: {ns.dataset}",
                                   ns.plot, f"offline_{ns.dataset}_throughput.png"))


def _shared_prefix(ns: argparse.Namespace):
    from radixlm.bench.datasets import SharedPrefixDataset

    if ns.dataset != "generated-shared-prefix":
        return None
    return SharedPrefixDataset(ns.gsp_num_groups, ns.gsp_prompts_per_group,
                               ns.gsp_system_prompt_len, ns.gsp_question_len, ns.gsp_output_len,
                               1, ns.seed)


def _dtype(ns: argparse.Namespace) -> None:
    from radixlm.bench.dtype import DtypeBenchConfig, dtype_table, run_dtype_bench

    cfg = DtypeBenchConfig(model=ns.model, dtypes=tuple(ns.dtypes), batch_size=ns.batch_size,
                           prompt_len=ns.prompt_len, decode_steps=ns.decode_steps,
                           repeat=ns.repeat, seed=ns.seed,
                           num_threads=ns.num_threads, output_file=ns.output_file,
                           engine_args=dict(ns.engine_arg))
    _print_with_warning(dtype_table, run_dtype_bench(cfg))


def _cold_start(ns: argparse.Namespace) -> None:
    from radixlm.bench.cold_start import (ColdStartConfig, ServerStartError, cold_start_table,
                                          run_cold_start)

    extra = list(ns.server_args)
    if extra[:1] == ["--"]:  # argparse keeps the separator in a REMAINDER list
        extra = extra[1:]
    cfg = ColdStartConfig(model=ns.model, server_args=tuple(extra),
                          timeout_s=ns.timeout, output_file=ns.output_file)
    try:
        _print_with_warning(cold_start_table, run_cold_start(cfg))
    except ServerStartError as e:
        print(f"radixlm bench cold-start: {e}", file=sys.stderr)
        sys.exit(1)


def _overlap(ns: argparse.Namespace) -> None:
    from radixlm.bench.overlap import OverlapBenchConfig, overlap_table, run_overlap_bench

    cfg = OverlapBenchConfig(model=ns.model, workload=ns.workload, num_prompts=ns.num_prompts,
                             output_len=ns.output_len, repeat=ns.repeat, seed=ns.seed,
                             num_threads=ns.num_threads, engine_args=dict(ns.engine_arg),
                             output_file=ns.output_file)
    print(overlap_table(run_overlap_bench(cfg)))


def _dashboard(ns: argparse.Namespace) -> None:
    from radixlm.bench.dashboard import DashboardBenchConfig, dashboard_table, run_dashboard_bench

    cfg = DashboardBenchConfig(model=ns.model, pages=ns.pages, max_concurrency=ns.max_concurrency,
                               num_prompts=ns.num_prompts, input_len=ns.input_len,
                               output_len=ns.output_len, repeat=ns.repeat, seed=ns.seed,
                               engine_args=dict(ns.engine_arg), output_file=ns.output_file)
    print(dashboard_table(run_dashboard_bench(cfg)))


def _spec(ns: argparse.Namespace) -> None:
    from radixlm.bench.spec import SpecBenchConfig, run_spec_bench, spec_table

    cfg = SpecBenchConfig(model=ns.model, algorithms=tuple(ns.algorithms),
                          max_tokens=ns.max_tokens, random_prompts=ns.random_prompts,
                          streams=tuple(ns.streams), stream_max_tokens=ns.stream_max_tokens,
                          engine_args=dict(ns.engine_arg), output_file=ns.output_file,
                          seed=ns.seed, starts=ns.starts,
                          llama_server_spec=tuple(ns.llama_server_spec),
                          llama_server=ns.llama_server)
    print(spec_table(run_spec_bench(cfg)))
def _hicache(ns: argparse.Namespace) -> None:
    from radixlm.bench.hicache import HiCacheBenchConfig, hicache_table, run_hicache_bench

    cfg = HiCacheBenchConfig(model=ns.model, system_len=ns.system_len,
                             device_tokens=ns.device_tokens, num_prefixes=ns.num_prefixes,
                             prefix_len=ns.prefix_len,
                             requests_per_prefix=ns.requests_per_prefix,
                             suffix_len=ns.suffix_len, output_len=ns.output_len,
                             host_ratio=ns.host_ratio,
                             storage_dir=ns.storage_dir, seed=ns.seed, parts=tuple(ns.parts))
    record = run_hicache_bench(cfg)
    if ns.output_file:
        with open(ns.output_file, "w") as f:
            json.dump(record, f, indent=1, default=str)
    print(hicache_table(record))


def _structured(ns: argparse.Namespace) -> None:
    from radixlm.bench.structured import (StructuredBenchConfig, run_structured_bench,
                                          structured_table)

    modes = {"serial": [False], "overlap": [True], "both": [False, True]}[ns.loop]
    cfg = StructuredBenchConfig(model=ns.model, batch_sizes=ns.batch_sizes,
                                output_len=ns.output_len, repeat=ns.repeat, overlap_modes=modes,
                                num_threads=ns.num_threads, engine_args=dict(ns.engine_arg),
                                output_file=ns.output_file, sections=ns.sections)
    print(structured_table(run_structured_bench(cfg)))


def serve_config_from(ns: argparse.Namespace):
    """The ServeBenchConfig of parsed `bench serve` flags (ours or bench_serving's)."""
    from radixlm.bench.cli_args import dataset_args_from
    from radixlm.bench.serve import ServeBenchConfig
    from radixlm.bench.sglang_flags import base_url_from, normalize_backend

    return ServeBenchConfig(
        dataset=dataset_args_from(ns), request_rate=ns.request_rate,
        max_concurrency=tuple(ns.max_concurrency), num_warmup=ns.warmup_requests,
        repeat=ns.repeat, base_url=base_url_from(ns), backend=normalize_backend(ns.backend),
        api_key=ns.api_key, server_pid=ns.server_pid, stream=not ns.disable_stream,
        extra_request_body=ns.extra_request_body,
        model=ns.model, tokenizer=ns.tokenizer, engine_args=dict(ns.engine_arg),
        ablations=tuple(ns.ablation), llama_server=ns.llama_server,
        transformers_baseline=ns.transformers_baseline,
        output_file=ns.output_file, output_details=ns.output_details,
        show_progress=not ns.disable_tqdm)


def _serve(ns: argparse.Namespace) -> None:
    from radixlm.bench.serve import run_serve_bench, serve_table
    from radixlm.bench.server_proc import ServerStartError

    try:
        cfg = serve_config_from(ns)
    except ValueError as e:
        print(f"radixlm bench serve: {e}", file=sys.stderr)
        sys.exit(2)
    try:
        records = run_serve_bench(cfg)
    except (ServerStartError, FileNotFoundError, ValueError) as e:
        print(f"radixlm bench serve: {e}", file=sys.stderr)
        sys.exit(1)
    print(serve_table(records))
    if (warning := load_warning(records[0])) is not None:
        print(warning)
    if ns.plot:
        from radixlm.bench.plots import plot_serve

        for path in plot_serve(records, ns.plot):
            print(f"wrote {path}")


def _soak(ns: argparse.Namespace) -> None:
    from contextlib import nullcontext

    from radixlm.bench.server_proc import LaunchedServer, radixlm_spec
    from radixlm.bench.soak import SoakConfig, plot_soak, run_soak

    launched = (nullcontext() if ns.base_url else
                LaunchedServer(radixlm_spec("radixlm", ns.model, dict(ns.engine_arg))))
    with launched as server:
        base_url = ns.base_url or server.spec.base_url
        pid = ns.server_pid if ns.base_url else server.proc.pid
        cfg = SoakConfig(base_url=base_url.rstrip("/"), minutes=ns.minutes,
                         concurrency=ns.concurrency, window_s=ns.window_s,
                         idle_every_s=ns.idle_every_s, max_tokens=ns.max_tokens, seed=ns.seed,
                         server_pid=pid)
        result = run_soak(cfg)
    print(json.dumps({"totals": result.totals, "failures": result.failures}, indent=1))
    if ns.output_file:
        with open(ns.output_file, "a") as f:
            f.write(result.to_json() + "\n")
    if ns.plot:
        print(f"wrote {plot_soak(result, ns.plot)}")
    if result.failures:
        sys.exit(1)


def _one_batch(ns: argparse.Namespace) -> None:
    from radixlm.bench.one_batch import OneBatchConfig, one_batch_table, run_one_batch

    cfg = OneBatchConfig(model=ns.model, dtype=ns.dtype, batch_sizes=tuple(ns.batch_sizes),
                         prompt_len=ns.prompt_len, decode_steps=ns.decode_steps,
                         repeat=ns.repeat, seed=ns.seed, copy_mib=ns.copy_mib,
                         num_threads=ns.num_threads, output_file=ns.output_file,
                         engine_args=dict(ns.engine_arg))
    record = run_one_batch(cfg)
    _print_with_warning(one_batch_table, record)
    if ns.plot:
        from radixlm.bench.plots import plot_bars

        rows = record["results"]
        print("wrote " + plot_bars([f"batch {r['batch_size']}" for r in rows],
                                   [100 * r["roofline_share"] for r in rows],
                                   "% of measured copy bandwidth",
                                   "Decode step: share of the bandwidth roofline", ns.plot,
                                   "one_batch_roofline.png"))


def _long_prompt(ns: argparse.Namespace) -> None:
    from radixlm.bench.long_prompt import (DEFAULT_CONFIGS, LongPromptConfig, long_prompt_table,
                                           run_long_prompt, timeline_series)

    cfg = LongPromptConfig(model=ns.model, configs=tuple(ns.config) or DEFAULT_CONFIGS,
                           num_streams=ns.num_streams, stream_prompt_len=ns.stream_prompt_len,
                           long_prompt_len=ns.long_prompt_len, warm_steps=ns.warm_steps,
                           tail_steps=ns.tail_steps, repeat=ns.repeat, seed=ns.seed,
                           num_threads=ns.num_threads, output_file=ns.output_file,
                           engine_args=dict(ns.engine_arg))
    record = run_long_prompt(cfg)
    _print_with_warning(long_prompt_table, record)
    if ns.plot:
        from radixlm.bench.plots import plot_timeline

        series, marks = timeline_series(record)
        print("wrote " + plot_timeline(series, marks, ns.plot, "long_prompt_itl_timeline.png",
                                       f"ITL of {cfg.num_streams} streams; a "
                                       f"{cfg.long_prompt_len}-token prompt arrives"))


def _concurrency(text: str) -> int | None:
    return None if text.lower() in ("inf", "none", "0") else int(text)


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from e
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _common(p: argparse.ArgumentParser, threads: bool = True) -> None:
    p.add_argument("--model", default=None, help="Model path (default: the default model).")
    p.add_argument("--output-file", default=None, help="Append one JSON line with the results.")
    if threads:
        p.add_argument("--num-threads", type=int, default=os.cpu_count() or 1,
                       help="torch.set_num_threads for every engine measured.")


def add_bench_parser(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser("bench",
                                  help="Benchmarks (offline throughput, dtype, cold start).")
    sub = bench.add_subparsers(dest="bench_command", required=True)

    off = sub.add_parser("offline", help="In-process throughput, radixlm vs transformers generate.")
    _common(off)
    off.add_argument("--dtype", default="auto", choices=_DTYPE_CHOICES)
    off.add_argument("--num-prompts", type=int, default=64)
    off.add_argument("--input-len-min", type=int, default=128)
    off.add_argument("--input-len-max", type=int, default=512)
    off.add_argument("--output-len", type=int, default=128)
    off.add_argument("--seed", type=int, default=0, help="Workload seed; repeat i uses seed + i.")
    # Fixed values (the published runs'), not the memory plan's derived defaults.
    off.add_argument("--max-running-requests", type=int, default=64)
    off.add_argument("--max-total-tokens", type=int, default=65536)
    off.add_argument("--max-prefill-tokens", type=int, default=_DEFAULTS.max_prefill_tokens)
    off.add_argument("--repeat", type=int, default=1, help="Runs per engine (interleaved); "
                     "the median is reported.")
    off.add_argument("--baseline", default="transformers", choices=["transformers", "none"])
    off.add_argument("--baseline-batch-size", type=int, default=None,
                     help="Static batch size of the baseline (default: --max-running-requests).")
    off.add_argument("--profile", default=None, metavar="FILE",
                     help="Write cProfile stats of the timed radixlm runs to FILE.")
    off.add_argument("--dataset", default="random", choices=["random", "generated-shared-prefix"],
                     help="random: --num-prompts/--input-len-*/--output-len; "
                     "generated-shared-prefix: the --gsp-* flags.")
    d = DatasetArgs()
    off.add_argument("--gsp-num-groups", type=int, default=d.gsp_num_groups)
    off.add_argument("--gsp-prompts-per-group", type=int, default=d.gsp_prompts_per_group)
    off.add_argument("--gsp-system-prompt-len", type=int, default=d.gsp_system_prompt_len)
    off.add_argument("--gsp-question-len", type=int, default=d.gsp_question_len)
    off.add_argument("--gsp-output-len", type=int, default=d.gsp_output_len)
    off.add_argument("--plot", default=None, metavar="DIR", help="Write PNG plots to DIR.")
    _add_engine_arg(off)
    add_ablation_arg(off)
    off.set_defaults(func=_offline)

    dt = sub.add_parser("dtype", help="One-batch prefill + decode speed per dtype.")
    _common(dt)
    dt.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "float16"],
                    choices=_DTYPE_CHOICES[1:])
    dt.add_argument("--batch-size", type=int, default=8)
    dt.add_argument("--prompt-len", type=int, default=128)
    dt.add_argument("--decode-steps", type=int, default=16)
    dt.add_argument("--repeat", type=int, default=1, help="Rounds over the dtypes (interleaved); "
                    "the median is reported.")
    dt.add_argument("--seed", type=int, default=0, help="Prompt seed; repeat i uses seed + i.")
    _add_engine_arg(dt)
    dt.set_defaults(func=_dtype)

    sv = sub.add_parser("serve", help="Serving load generator for OpenAI-compatible servers; "
                        "without --base-url, starts radixlm (+ ablations, llama-server) itself.")
    _common(sv, threads=False)
    sv.add_argument("--base-url", default=None,
                    help="A running server, e.g. http://127.0.0.1:30000 (default: start them).")
    sv.add_argument("--backend", default="openai", choices=list(BACKENDS),
                    help="openai, or any OpenAI-compatible backend name of SGLang's "
                    "bench_serving (sglang, vllm, ...: the same /v1/completions load); "
                    "radixlm: also flush the server's cache before each run and read its "
                    "/server_info (servers this command starts always use it).")
    add_host_port_args(sv)
    sv.add_argument("--api-key", default=None)
    sv.add_argument("--server-pid", type=int, default=None,
                    help="With --base-url: the server's pid, for the CPU seconds (and CPU ms "
                    "per generated token) of each of its processes.")
    sv.add_argument("--disable-stream", action="store_true",
                    help="bench_serving's: unary requests instead of streamed ones (TTFT = "
                    "E2E latency).")
    sv.add_argument("--extra-request-body", type=_json_object, default=None,
                    metavar='\'{"temperature": 1.0, "top_p": 0.9}\'',
                    help="bench_serving's: JSON merged into every request's body (requests "
                    "are greedy otherwise).")
    sv.add_argument("--tokenizer", default=None, help="Tokenizer for prompt lengths "
                    "(default: the model's).")
    add_dataset_args(sv)
    sv.add_argument("--request-rate", type=float, default=float("inf"),
                    help="Requests/s, Poisson arrivals; inf = all at once.")
    sv.add_argument("--max-concurrency", type=_concurrency, nargs="+", default=[None],
                    help="Max requests in flight; several values run one after another "
                    "(throughput vs concurrency). inf = no cap.")
    sv.add_argument("--warmup-requests", type=int, default=1)
    sv.add_argument("--repeat", type=int, default=1, help="Runs per server (interleaved); "
                    "the table shows medians.")
    sv.add_argument("--transformers-baseline", default="none",
                    choices=["none", "auto", "float32", "bfloat16"],
                    help="Also run the same requests through transformers' generate in this "
                    "process (static batches of each --max-concurrency; auto: bfloat16 on "
                    "CPUs with AMX-BF16/AVX512-BF16, else float32), side by side.")
    sv.add_argument("--llama-server", default=None, metavar="PATH",
                    help="llama-server binary to compare with (default: llama-server on PATH "
                    "or .llama_cpp/bin/llama-server if built; 'none' to skip).")
    sv.add_argument("--output-details", action="store_true",
                    help="Per-request TTFTs, ITLs and latencies in the JSON lines.")
    sv.add_argument("--plot", default=None, metavar="DIR", help="Write PNG plots to DIR.")
    sv.add_argument("--disable-tqdm", action="store_true")
    _add_engine_arg(sv)
    add_ablation_arg(sv)
    sv.set_defaults(func=_serve)

    sk = sub.add_parser("soak", help="A long mixed workload (streams, unary, cancellations, "
                        "bad requests, deadlines; shared prefixes): RSS, idle KV slots, errors "
                        "and p99 latency over time (radixlm/bench/soak.py).")
    _common(sk, threads=False)
    sk.add_argument("--minutes", type=float, default=30.0)
    sk.add_argument("--base-url", default=None, help="A running server (default: start "
                    "radixlm with --model and --engine-arg).")
    sk.add_argument("--server-pid", type=int, default=None,
                    help="With --base-url: the server's pid, for RSS (default: no RSS).")
    sk.add_argument("--concurrency", type=int, default=8)
    sk.add_argument("--window-s", type=float, default=15.0, help="Summary period.")
    sk.add_argument("--idle-every-s", type=float, default=60.0,
                    help="Period of the idle checks (clients pause, pool read).")
    sk.add_argument("--max-tokens", type=int, default=48)
    sk.add_argument("--seed", type=int, default=0)
    sk.add_argument("--plot", default=None, metavar="PNG")
    _add_engine_arg(sk)
    sk.set_defaults(func=_soak)

    ob = sub.add_parser("one-batch", help="Prefill latency and decode step time of a static "
                        "batch; achieved bandwidth and share of the measured roofline.")
    _common(ob)
    ob.add_argument("--dtype", default="auto", choices=_DTYPE_CHOICES)
    ob.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    ob.add_argument("--prompt-len", type=int, default=128)
    ob.add_argument("--decode-steps", type=int, default=16)
    ob.add_argument("--repeat", type=int, default=1, help="Rounds over the batch sizes "
                    "(interleaved); medians are reported.")
    ob.add_argument("--seed", type=int, default=0)
    ob.add_argument("--copy-mib", type=int, default=512,
                    help="Buffer size of the bandwidth-measuring copy.")
    ob.add_argument("--plot", default=None, metavar="DIR", help="Write PNG plots to DIR.")
    _add_engine_arg(ob)
    ob.set_defaults(func=_one_batch)

    lp = sub.add_parser("long-prompt", help="ITL of running streams while a long prompt "
                        "arrives, per configuration (default: chunked prefill on vs off).")
    _common(lp)
    lp.add_argument("--config", type=parse_ablation, action="append", default=[],
                    metavar="NAME:KEY=VALUE[,KEY=VALUE]",
                    help="A configuration to compare (repeatable; default: 'chunked "
                    "(default)' and 'no-chunk:chunked_prefill_size=-1'); 'NAME:' = the defaults.")
    lp.add_argument("--num-streams", type=int, default=8)
    lp.add_argument("--stream-prompt-len", type=int, default=64)
    lp.add_argument("--long-prompt-len", type=int, default=2048)
    lp.add_argument("--warm-steps", type=int, default=8,
                    help="Decode steps of the streams before the long prompt arrives.")
    lp.add_argument("--tail-steps", type=int, default=4,
                    help="Steps after the long prompt's first token still in the window.")
    lp.add_argument("--repeat", type=int, default=1)
    lp.add_argument("--seed", type=int, default=0)
    lp.add_argument("--plot", default=None, metavar="DIR", help="Write PNG plots to DIR.")
    _add_engine_arg(lp)
    lp.set_defaults(func=_long_prompt)

    st = sub.add_parser("structured", help="Constrained decoding: decode throughput with "
                        "every request constrained vs none, grammar compile time p50/p99.")
    _common(st)
    _add_engine_arg(st)
    st.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    st.add_argument("--output-len", type=int, default=64)
    st.add_argument("--repeat", type=int, default=2)
    st.add_argument("--loop", choices=["serial", "overlap", "both"], default="both")
    st.add_argument("--sections", nargs="+", choices=["decode", "jump", "compile"],
                    default=["decode", "jump", "compile"],
                    help="decode: constrained vs none; jump: jump-forward on vs off over "
                    "the schema corpus; compile: grammar compile times.")
    st.set_defaults(func=_structured)

    db = sub.add_parser("dashboard", help="Serving throughput with N /dashboard pages open vs "
                        "none, alternately in one run (what watching costs).")
    _common(db, threads=False)
    _add_engine_arg(db)
    db.add_argument("--pages", type=int, default=3, help="Event streams open in the 'on' runs.")
    db.add_argument("--max-concurrency", type=int, default=32)
    db.add_argument("--num-prompts", type=int, default=96)
    db.add_argument("--input-len", type=int, default=128)
    db.add_argument("--output-len", type=int, default=64)
    db.add_argument("--repeat", type=int, default=3)
    db.add_argument("--seed", type=int, default=0)
    db.set_defaults(func=_dashboard)

    sp = sub.add_parser("spec", help="Speculative decoding on vs off through the HTTP API "
                        "(fresh server per configuration): copy-heavy, repeating chat, random, "
                        "and random at N streams; tok/s ratios and acceptance lengths.")
    _common(sp, threads=False)
    _add_engine_arg(sp)
    sp.add_argument("--algorithms", nargs="+", default=["NGRAM", "SUFFIX"],
                    help="NAME or NAME:K (K draft tokens), each a configuration beside off")
    sp.add_argument("--max-tokens", type=int, default=256)
    sp.add_argument("--random-prompts", type=int, default=4)
    sp.add_argument("--streams", type=int, nargs="*", default=[8, 32])
    sp.add_argument("--stream-max-tokens", type=int, default=64)
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--starts", type=int, default=1,
                    help="Fresh server starts per configuration, interleaved (off, on, ..., "
                    "then in reverse); the table reports the median tok/s and its spread.")
    sp.add_argument("--llama-server-spec", nargs="*", default=[], metavar="TYPE[:M[:N]]",
                    help="The peer: llama-server (same GGUF) with --spec-type TYPE, drafts of "
                    "M tokens after N-token matches where given (its defaults otherwise), "
                    "each a configuration beside its plain decoding (e.g. ngram-simple "
                    "ngram-simple:7:3 ngram-mod)")
    sp.add_argument("--llama-server", default=None,
                    help="llama-server binary (default: on PATH, or .llama_cpp/bin)")
    sp.set_defaults(func=_spec)

    ov = sub.add_parser("overlap", help="Overlap scheduler vs the serial loop, side by side: "
                        "throughput ratio and the device bubble.")
    _common(ov)
    ov.add_argument("--workload", choices=["decode", "mixed"], default="decode")
    ov.add_argument("--num-prompts", type=int, default=None)
    ov.add_argument("--output-len", type=int, default=None)
    ov.add_argument("--repeat", type=int, default=3)
    ov.add_argument("--seed", type=int, default=0)
    _add_engine_arg(ov)
    ov.set_defaults(func=_overlap)

    hc = sub.add_parser("hicache", help="Hierarchical cache: restart TTFT with the storage "
                        "tier vs none, capacity hit rate and throughput, load bandwidth vs dd.")
    _common(hc, threads=False)
    hc.add_argument("--system-len", type=int, default=4000)
    hc.add_argument("--device-tokens", type=int, default=8192, help="Device KV pool (capacity).")
    hc.add_argument("--num-prefixes", type=int, default=16)
    hc.add_argument("--prefix-len", type=int, default=2048)
    hc.add_argument("--requests-per-prefix", type=int, default=32,
                    help="Requests revisiting each prefix (scale down on a slow machine).")
    hc.add_argument("--suffix-len", type=int, default=16,
                    help="Distinct tokens after each prefix (capacity).")
    hc.add_argument("--output-len", type=int, default=8, help="Tokens generated (capacity).")
    hc.add_argument("--host-ratio", type=float, default=2.0,
                    help="Capacity: also run the host tier (this x the device pool) over the "
                    "storage tier, and the device pool enlarged by the same bytes instead "
                    "(0: skip both).")
    hc.add_argument("--storage-dir", default=None, help="Default: a temporary directory.")
    hc.add_argument("--parts", nargs="+", default=["restart", "capacity", "bandwidth"],
                    choices=["restart", "capacity", "bandwidth"])
    hc.add_argument("--seed", type=int, default=0)
    hc.set_defaults(func=_hicache)

    cs = sub.add_parser("cold-start", help="Seconds from `radixlm serve` start to the first "
                        "token, with a fresh and then a warm RADIXLM_CACHE_DIR.")
    _common(cs, threads=False)
    cs.add_argument("--timeout", type=float, default=600.0, help="Give up on a start after this.")
    cs.add_argument("server_args", nargs=argparse.REMAINDER,
                    help="Extra `radixlm serve` flags, after `--`.")
    cs.set_defaults(func=_cold_start)
