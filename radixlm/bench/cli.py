"""`radixlm bench offline | dtype | cold-start`: argparse wiring only; the work is elsewhere."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import types
import typing
from typing import Any

from radixlm.config import ServerArgs

_DTYPE_CHOICES = ["auto", "float32", "bfloat16", "float16"]
_DEFAULTS = ServerArgs()


def parse_engine_arg(text: str) -> tuple[str, Any]:
    """`chunked_prefill_size=-1` (or `--chunked-prefill-size=-1`) -> ("chunked_prefill_size", -1),
    the value converted to the ServerArgs field's type."""
    key, sep, value = text.partition("=")
    key = key.strip().lstrip("-").replace("-", "_")
    hints = typing.get_type_hints(ServerArgs)
    if not sep or key not in {f.name for f in dataclasses.fields(ServerArgs)}:
        raise argparse.ArgumentTypeError(f"expected SERVER_ARG=VALUE with a ServerArgs field, "
                                         f"got {text!r}")
    tp = hints[key]
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        if value.lower() == "none":
            return key, None
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    if tp is bool:
        return key, value.lower() in ("1", "true", "yes", "on")
    try:
        return key, tp(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{key}: {e}") from None


def _add_engine_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine-arg", type=parse_engine_arg, action="append", default=[],
                   metavar="KEY=VALUE", help="Any other ServerArgs field for the radixlm "
                   "engine, e.g. chunked_prefill_size=-1 (repeatable).")


def _print_with_warning(table, record: dict) -> None:
    from radixlm.bench.report import load_warning

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
        output_file=ns.output_file, profile_file=ns.profile, engine_args=dict(ns.engine_arg))
    _print_with_warning(offline_table, run_offline(cfg))


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
    off.add_argument("--max-running-requests", type=int, default=_DEFAULTS.max_running_requests)
    off.add_argument("--max-total-tokens", type=int, default=_DEFAULTS.max_total_tokens)
    off.add_argument("--max-prefill-tokens", type=int, default=_DEFAULTS.max_prefill_tokens)
    off.add_argument("--repeat", type=int, default=1, help="Runs per engine (interleaved); "
                     "the median is reported.")
    off.add_argument("--baseline", default="transformers", choices=["transformers", "none"])
    off.add_argument("--baseline-batch-size", type=int, default=None,
                     help="Static batch size of the baseline (default: --max-running-requests).")
    off.add_argument("--profile", default=None, metavar="FILE",
                     help="Write cProfile stats of the timed radixlm runs to FILE.")
    _add_engine_arg(off)
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

    cs = sub.add_parser("cold-start", help="Seconds from `radixlm serve` start to the first "
                        "token, with a fresh and then a warm RADIXLM_CACHE_DIR.")
    _common(cs, threads=False)
    cs.add_argument("--timeout", type=float, default=600.0, help="Give up on a start after this.")
    cs.add_argument("server_args", nargs=argparse.REMAINDER,
                    help="Extra `radixlm serve` flags, after `--`.")
    cs.set_defaults(func=_cold_start)
