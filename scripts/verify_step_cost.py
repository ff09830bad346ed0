"""What a speculative verify step costs next to a decode step, on the CPU, in one process.

    python scripts/verify_step_cost.py [--model M] [--dtype auto] [--prompt-len 256]
                                       [--ks 1,2,4,7] [--batch 1] [--iters 30]

One engine (default model); per request a prompt of --prompt-len random tokens is
prefilled once (real K/V), then three forwards are timed over the same request rows,
interleaved in rounds so that load on the machine hits them alike:

    decode            one token per request (ForwardMode.DECODE; the C++ decode kernel);
    verify (extend)   k + 1 tokens per request, TARGET_VERIFY through the extend loop
                      (per request SDPA with the causal mask; the path before the kernel);
    verify (kernel)   the same batch, its rows as decode rows of the C++ kernel;
    verify (int8 N)   with --int8-max-m N: the kernel batch again with the int8-group
                      methods' small-call limit (the default model's LM head) set to N for
                      the call (4: the limit before it took 8 rows; beyond N a dense GEMM).

Each is ModelRunner.forward (embedding to logits at every row: a verify's LM head runs on
k + 1 rows), median and minimum over --iters rounds (on a loaded machine the minimum is
the less disturbed figure). The verify writes k + 1 slots past the prompt and
the decode one: the pool is reused, nothing is sampled or appended. Prints the medians
and the ratios verify / decode; a verify step pays off when its ratio is below the
expected tokens per step (1 + mean accepted).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from radixlm.engine import Engine
from radixlm.forward_batch import ForwardBatch, ForwardMode
from radixlm.models.linear.int8_groups import Int8GroupwiseLinear
from radixlm.models.linear.policy import top_level_methods
from radixlm.models.loader import resolve_model_path


def _batch(runner, mode: ForwardMode, rows: list[int], slots: list[torch.Tensor],
           prefix: int, n: int, vocab: int, g: torch.Generator) -> ForwardBatch:
    """n new tokens per request at positions prefix .. prefix + n - 1 (recorded in
    req_to_token); mode DECODE needs n == 1."""
    b = len(rows)
    loc = torch.cat([s[prefix:prefix + n] for s in slots])
    for r, s in zip(rows, slots):
        runner.req_to_token_pool.write(r, prefix, s[prefix:prefix + n])
    positions = torch.arange(prefix, prefix + n).repeat(b)
    rows_t = torch.tensor(rows, dtype=torch.int64)
    seq = [prefix + n] * b
    ids = torch.randint(0, vocab, (b * n,), generator=g)
    common = dict(batch_size=b, input_ids=ids, positions=positions, req_pool_indices=rows_t,
                  seq_lens=torch.tensor(seq), out_cache_loc=loc,
                  logits_indices=torch.arange(b * n), seq_lens_cpu=seq,
                  req_to_token_pool=runner.req_to_token_pool,
                  token_to_kv_pool=runner.token_to_kv_pool)
    if mode is ForwardMode.DECODE:
        return ForwardBatch(forward_mode=mode, **common)
    return ForwardBatch(forward_mode=mode, extend_prefix_lens_cpu=[prefix] * b,
                        extend_seq_lens_cpu=[n] * b, req_pool_indices_cpu=list(rows), **common)


def _time(runner, fb: ForwardBatch) -> float:
    t0 = time.perf_counter()
    runner.forward(fb)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--ks", default="1,2,4,7", help="draft lengths k (verify rows = k + 1)")
    ap.add_argument("--batch", type=int, default=1, help="requests per step")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--num-threads", type=int, default=None)
    ap.add_argument("--int8-max-m", type=int, default=None,
                    help="also time the kernel verify with the int8-group methods' limit at this")
    args = ap.parse_args()
    ks = [int(x) for x in args.ks.split(",")]
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    model_path = resolve_model_path(args.model)
    engine = Engine(model_path, dtype=args.dtype,
                    disable_overlap_schedule=True, max_running_requests=max(4, args.batch),
                    max_total_tokens=args.batch * (args.prompt_len + max(ks) + 8) + 512)
    runner = engine.scheduler.runner
    backend = runner.attn_backend
    if not getattr(backend, "decode_kernel", False):
        raise SystemExit(f"{type(backend).__name__}: no CPU decode kernel here, nothing to compare")
    g = torch.Generator().manual_seed(0)
    vocab = runner.vocab_size
    p = args.prompt_len
    rows = [runner.req_to_token_pool.alloc() for _ in range(args.batch)]
    page = runner.allocator.page_size
    need = -(-(p + max(ks) + 1) // page) * page  # whole pages
    slots = [runner.allocator.alloc(need) for _ in rows]
    if any(s is None for s in slots) or any(r is None for r in rows):
        raise SystemExit("the pool is too small for the batch")
    runner.forward(_batch(runner, ForwardMode.EXTEND, rows, slots, 0, p, vocab, g))
    print(f"model {os.path.basename(model_path)}, dtype {runner.dtype}, batch {args.batch}, prompt {p}, threads {torch.get_num_threads()},"
          f" {args.iters} rounds")
    methods = [m for m in top_level_methods(runner.model) if isinstance(m, Int8GroupwiseLinear)]
    limits = [m.max_m for m in methods]
    names = ["extend", "kernel"] + ([f"int8 {args.int8_max_m}"] if args.int8_max_m else [])
    times: dict[str, list[float]] = {"decode": []}
    for k in ks:
        for name in names:
            times[f"{name} k={k}"] = []
    for it in range(args.iters + 2):  # the first two rounds warm up
        rec = {"decode": _time(runner, _batch(runner, ForwardMode.DECODE, rows, slots, p, 1,
                                              vocab, g))}
        for k in ks:
            for name, kernel in (("extend", False), ("kernel", True)):
                backend.verify_kernel = kernel
                fb = _batch(runner, ForwardMode.TARGET_VERIFY, rows, slots, p, k + 1, vocab, g)
                rec[f"{name} k={k}"] = _time(runner, fb)
            if args.int8_max_m:
                for m in methods:
                    m.max_m = args.int8_max_m
                fb = _batch(runner, ForwardMode.TARGET_VERIFY, rows, slots, p, k + 1, vocab, g)
                rec[f"int8 {args.int8_max_m} k={k}"] = _time(runner, fb)
                for m, limit in zip(methods, limits):
                    m.max_m = limit
        backend.verify_kernel = True
        if it >= 2:
            for name, t in rec.items():
                times[name].append(t)
    dec, dec_min = statistics.median(times["decode"]), min(times["decode"])
    print(f"{'step':<15}{'rows':>5}{'median ms':>11}{'/ decode':>10}{'min ms':>9}{'/ decode':>10}")
    print(f"{'decode':<15}{args.batch:>5}{dec * 1e3:>11.2f}{1.0:>10.2f}{dec_min * 1e3:>9.2f}"
          f"{1.0:>10.2f}")
    for k in ks:
        for name in names:
            t, t_min = statistics.median(times[f"{name} k={k}"]), min(times[f"{name} k={k}"])
            print(f"{'verify ' + name:<15}{args.batch * (k + 1):>5}{t * 1e3:>11.2f}"
                  f"{t / dec:>10.2f}{t_min * 1e3:>9.2f}{t_min / dec_min:>10.2f}")


if __name__ == "__main__":
    main()
