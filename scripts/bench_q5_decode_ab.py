"""Gemma 3 270M Q4_K_M (or --model) decode steps of `--batch` requests (default 1) under two or more
linear policies, every model in one process and their steps interleaved (A, B, A, B, ...),
so that a shared, loaded machine disturbs all alike. Eager forward through the real pools
(tests' PoolHarness), KV in the run's dtype (`--dtype`, default bfloat16). Default
policies: Q5_0 layers on the q5_bf16 kernel vs as int8 groups
(`LinearPolicy(q5_kernel=False)`, the path before); `--policy` (repeated) gives others
as LinearPolicy("auto") fields, e.g. the int8-group row limit (on AVX2, e.g. `--dtype
float32 --policy quantization=none --policy groups_f32_max_m=32`):

    PYTHONPATH=$PWD RADIXLM_CACHE_DIR=... python scripts/bench_q5_decode_ab.py \
        [--steps 64] [--threads 1] [--batch 4] \
        [--policy int8_groups_max_m=8 --policy int8_groups_max_m=4] [--prefill-len 1024]

`--prefill-len N` also times prefills of N tokens (one request each, `--prefill-reps`
per policy, interleaved), e.g. `--policy amx_tiles=True --policy amx_tiles=False`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from radixlm.models import load_model
from radixlm.models.linear import LinearPolicy
from radixlm.models.linear.policy import top_level_methods
from radixlm.models.packaged import gemma3_270m_gguf
from tests.conftest_models import PoolHarness


def parse_fields(text: str) -> dict:
    """'a=4,b=False,c=None,q=none' -> {'a': 4, 'b': False, 'c': None, 'q': 'none'} (ints,
    booleans, None, else the string)."""
    consts = {"True": True, "False": False, "None": None}
    out = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        out[key] = (consts[value] if value in consts
                    else int(value) if value.lstrip("-").isdigit() else value)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--model", help="a GGUF (default: Gemma 3 270M Q4_K_M)")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                    help="the run's dtype, the KV cache's too")
    ap.add_argument("--prefill-len", type=int, default=0,
                    help="also time prefills of this many tokens (one request, interleaved)")
    ap.add_argument("--prefill-reps", type=int, default=5)
    ap.add_argument("--policy", action="append", default=[],
                    help="FIELD=VALUE[,FIELD=VALUE]: a LinearPolicy('auto') variant")
    args = ap.parse_args()
    variants = [(text, LinearPolicy(**{"quantization": "auto", **parse_fields(text)}))
                for text in args.policy] or [
        ("q5_bf16", LinearPolicy("auto")), ("int8 groups", LinearPolicy("auto", q5_kernel=False))]
    if args.threads:
        torch.set_num_threads(args.threads)
    path = args.model or gemma3_270m_gguf()
    dtype = getattr(torch, args.dtype)
    runs = {}
    for name, policy in variants:
        model, cfg = load_model(path, dtype, "cpu", linear_policy=policy)
        mb = sum(m.bytes_read(args.batch) for m in top_level_methods(model)) / 1e6
        per = args.prompt_len + args.steps + 8
        extra = args.prefill_reps if args.prefill_len else 0
        h = PoolHarness(model, cfg, max_requests=args.batch + extra,
                        max_context=max(per, args.prefill_len),
                        num_slots=args.batch * per + extra * args.prefill_len + 8,
                        kv_dtype=dtype)
        rows = [h.new_request() for _ in range(args.batch)]
        with torch.inference_mode():
            for b, row in enumerate(rows):
                h.extend([row], [[2] + [(7 * i + b) % 5000 + 100 for i in range(args.prompt_len - 1)]])
        runs[name] = (h, rows, mb, [])
    print(f"threads {torch.get_num_threads()}, batch {args.batch}, {args.steps} interleaved steps each")
    with torch.inference_mode():
        for step in range(args.steps):
            for name, (h, rows, _, times) in runs.items():
                t0 = time.perf_counter()
                h.decode(rows, [100 + step] * len(rows))
                times.append((time.perf_counter() - t0) * 1e3)
    prefill = {name: [] for name in runs}
    with torch.inference_mode():
        for rep in range(args.prefill_reps if args.prefill_len else 0):
            for name, (h, _, _, _) in runs.items():
                prompt = [2] + [(11 * i + rep) % 5000 + 100 for i in range(args.prefill_len - 1)]
                row = h.new_request()
                t0 = time.perf_counter()
                h.extend([row], [prompt])
                prefill[name].append(time.perf_counter() - t0)
    for name, times in prefill.items():
        if times:
            print(f"{name:24s} prefill of {args.prefill_len} tokens: median "
                  f"{statistics.median(times) * 1e3:8.1f} ms "
                  f"({args.prefill_len / statistics.median(times):7.1f} tok/s), "
                  f"min {min(times) * 1e3:8.1f} ms")
    for name, (_, _, mb, times) in runs.items():
        print(f"{name:24s} weights read/step {mb:7.2f} MB  step ms median {statistics.median(times):7.2f}"
              f"  p25 {statistics.quantiles(times, n=4)[0]:7.2f}  min {min(times):7.2f}")


if __name__ == "__main__":
    main()
