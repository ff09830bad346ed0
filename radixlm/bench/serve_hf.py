"""The transformers baseline of `radixlm bench serve --transformers-baseline`: the same
requests through `model.generate` in this process, static batches of the run's
concurrency (all requests at once for inf), on the same weights.

What a user would run instead of a server: each batch waits for its slowest request, so
`output_throughput` = output tokens / wall time over the batches is comparable with the
servers' output tok/s at the same concurrency. Greedy, exactly `output_len` new tokens per
request; TTFT and ITL are not observable through `generate` and stay None.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from radixlm.bench.datasets import BenchRequest
from radixlm.bench.hf_baseline import HFBaseline

BASELINE_NAME = "transformers"


def resolve_baseline_dtype(name: str) -> torch.dtype:
    """auto: transformers' fastest dtype on this CPU, by radixlm's own --dtype auto rule
    (bfloat16 with AMX-BF16 / AVX512-BF16, else float32)."""
    from radixlm.runtime.device import resolve_dtype

    if name not in ("auto", "float32", "bfloat16"):
        raise ValueError(f"--transformers-baseline must be auto, float32, bfloat16 or none, "
                         f"got {name!r}")
    return resolve_dtype(name, torch.device("cpu"))


def request_ids(req: BenchRequest, tokenizer: Any) -> list[int]:
    if isinstance(req.prompt, list):
        return list(req.prompt)
    return tokenizer.encode(req.prompt, add_special_tokens=False)


def run_hf_requests(baseline: HFBaseline, requests: list[BenchRequest], tokenizer: Any,
                    concurrency: int | None) -> dict[str, Any]:
    """Metrics in the servers' field names (serve_metrics.compute_metrics) for the ones
    that `generate` has."""
    if any(r.follow_ups for r in requests):
        raise ValueError("the transformers baseline runs single-turn requests only")
    prompts = [request_ids(r, tokenizer) for r in requests]
    baseline.batch_size = concurrency or len(prompts)
    out_tokens = 0
    t0 = time.perf_counter()
    # One generate call per group of requests with the same output length (random
    # datasets may vary it), each in static batches of the concurrency.
    by_len: dict[int, list[list[int]]] = {}
    for p, r in zip(prompts, requests):
        by_len.setdefault(r.output_len, []).append(p)
    for output_len, group in by_len.items():
        outs = baseline.generate(group, output_len)
        out_tokens += sum(len(o) for o in outs)
    duration = time.perf_counter() - t0
    in_tokens = sum(len(p) for p in prompts)
    return {"completed": len(prompts), "failed": 0, "duration": duration,
            "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
            "request_throughput": len(prompts) / duration,
            "output_throughput": out_tokens / duration,
            "total_throughput": (in_tokens + out_tokens) / duration,
            "model_id": f"{BASELINE_NAME} {str(baseline.model.dtype).removeprefix('torch.')}",
            "errors": [], "details": {"success": [True] * len(prompts),
                                      "input_lens": [len(p) for p in prompts],
                                      "output_lens": [r.output_len for r in requests]}}
