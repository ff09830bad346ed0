"""Linear methods on a whole model, side by side in one process: prefill tok/s of one
prompt and the decoder's GEMM time at a decode batch.

    python scripts/bench_w8a8_model.py [--model PATH] [--prompt-len 1024] [--batch 32]
        [--quantization none,auto,w8a8_int8] [--rounds 3] [--threads 0]

Loads the model (default: the project's default GGUF) once per --quantization, bfloat16
on the CPU, then per round and method: one EXTEND forward of a `--prompt-len` random
prompt (fresh KV each time; tok/s = prompt_len / seconds), and every decoder linear
layer called once on `--batch` random rows (the GEMMs of one decode step at that batch,
LM head excluded). Rounds interleave the methods; medians are printed with the ratio
to the first method.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from radixlm.models import load_model, resolve_model_path  # noqa: E402
from radixlm.models.linear import LinearPolicy  # noqa: E402
from radixlm.models.linear.policy import top_level_methods  # noqa: E402
from tests.conftest_models import PoolHarness  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None)
    p.add_argument("--prompt-len", type=int, default=1024)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--quantization", default="none,auto,w8a8_int8")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=0)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    path = resolve_model_path(a.model)
    models = {q: load_model(path, torch.bfloat16, "cpu", linear_policy=LinearPolicy(q))
              for q in a.quantization.split(",")}
    vocab = next(iter(models.values()))[1].vocab_size
    prompt = torch.randint(0, vocab, (a.prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    prefill: dict[str, list[float]] = {q: [] for q in models}
    gemm: dict[str, list[float]] = {q: [] for q in models}
    for _ in range(a.rounds):
        for q, (model, config) in models.items():
            h = PoolHarness(model, config, max_requests=2, max_context=a.prompt_len + 8,
                            num_slots=a.prompt_len + 16, kv_dtype=torch.bfloat16)
            t0 = time.perf_counter()
            h.extend([h.new_request()], [prompt])
            prefill[q].append(a.prompt_len / (time.perf_counter() - t0))
            layers = top_level_methods(model.model)
            with torch.no_grad():
                xs = {id(m): torch.randn(a.batch, _in_features(m)).bfloat16() for m in layers}
                for m in layers:  # warm-up
                    m(xs[id(m)])
                t0 = time.perf_counter()
                for m in layers:
                    m(xs[id(m)])
                gemm[q].append((time.perf_counter() - t0) * 1e3)
    first = next(iter(models))
    p0, g0 = statistics.median(prefill[first]), statistics.median(gemm[first])
    print(f"torch threads {torch.get_num_threads()}; medians of {a.rounds} rounds")
    print(f"{'quantization':14} {'prefill tok/s':>22} {'decode GEMMs ms (batch ' + str(a.batch) + ')':>30}")
    for q in models:
        pm, gm = statistics.median(prefill[q]), statistics.median(gemm[q])
        print(f"{q:14} {pm:14.1f} ({pm / p0:4.2f}x) {gm:22.2f} ({g0 / gm:4.2f}x)")


def _in_features(method) -> int:
    if hasattr(method, "in_features"):
        return method.in_features
    fb = getattr(method, "fallback", None)
    if fb is not None:
        return _in_features(fb)
    return method.dequantized_weight().shape[1]


if __name__ == "__main__":
    main()
