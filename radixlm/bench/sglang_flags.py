"""SGLang `bench_serving` flag names accepted by `radixlm bench serve`, with their meaning.

Most of its flags are ours already under the same names (--num-prompts,
--random-input-len, --random-output-len, --random-range-ratio, --request-rate,
--max-concurrency, --base-url, --output-file, --dataset-path, --seed, --disable-tqdm).
The rest map here:
  * --dataset-name: our --dataset; `random-ids` (random token ids) is our `random`.
  * --backend: every OpenAI-compatible one of bench_serving's (sglang, sglang-oai, vllm,
    lmdeploy, ...) means the OpenAI endpoints (`/v1/completions`, streamed), as ours
    `openai` does; `radixlm` also flushes the cache before each run and reads /server_info.
    Chat-endpoint backends are refused: the load generator sends completions.
  * --host / --port: the server at http://HOST:PORT when --base-url is not given (without
    any of the three, the command starts the servers itself).
"""

from __future__ import annotations

import argparse

OPENAI_COMPATIBLE = ("openai", "sglang", "sglang-oai", "sglang-native", "vllm", "lmdeploy",
                     "trt", "tgi")
BACKENDS = (*OPENAI_COMPATIBLE, "radixlm")
DATASET_ALIASES = {"random-ids": "random"}


def normalize_backend(name: str) -> str:
    """bench_serving's backend name -> ours ("openai" | "radixlm")."""
    if name not in BACKENDS:
        raise ValueError(f"--backend must be one of {BACKENDS}, got {name!r}")
    return "radixlm" if name == "radixlm" else "openai"


def normalize_dataset(name: str) -> str:
    return DATASET_ALIASES.get(name, name)


def add_host_port_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default=None, help="bench_serving's: with --port, the server at "
                   "http://HOST:PORT (when --base-url is not given).")
    p.add_argument("--port", type=int, default=None, help="See --host (default host 127.0.0.1).")


def base_url_from(ns: argparse.Namespace) -> str | None:
    if ns.base_url:
        return ns.base_url
    if ns.host is None and ns.port is None:
        return None
    return f"http://{ns.host or '127.0.0.1'}:{ns.port or 30000}"
