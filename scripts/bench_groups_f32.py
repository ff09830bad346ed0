"""Side by side in one process: the groups_f32 C++ kernel (int4 / int8 groups x float32
activations, AVX2) against the dense float32 weights it replaces (oneDNN prepacked), on
SmolLM2-135M's shapes: one decoder layer's four projections (Q4_1-like int4 groups; x 30
layers a decode step) and the tied 49152 x 576 head (Q8_0-like int8 groups), at each
row count; methods timed in turn, best of `--rounds` batches of `--calls` calls.

    PYTHONPATH=$PWD python scripts/bench_groups_f32.py [--rows 1 4 16 32 64] [--threads 2]

The layer's weights (14 MB dense) fit this CPU's L3 where the 30 layers of a real step do
not: the decode-step figures come from `scripts/bench_q5_decode_ab.py --dtype float32`.
"""

from __future__ import annotations

import argparse
import time

import torch

from radixlm.bench.report import machine_info
from radixlm.models.linear.groups_f32 import groups_f32_kernel
from radixlm.models.linear.int4 import Int4GroupwiseLinear
from radixlm.models.linear.int4_groups import Int4Groups
from radixlm.models.linear.int8_groups import Int8Groups, Int8GroupwiseLinear
from radixlm.models.linear.method import PrepackedLinear

LAYER = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, o, gate_up, down
HEAD = (49152, 576)


def best_us(fn, calls: int, rounds: int) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if groups_f32_kernel() is None:
        raise SystemExit("groups_f32 did not build here (needs AVX2, FMA, F16C)")
    if args.threads:
        torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    layer = []
    for n, k in LAYER:
        q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
        d = (torch.rand(n, k // 32, generator=g) * 0.01).half().float()
        m = (-8 * d).half().float()
        groups = Int4Groups(q, d, m)
        dense = PrepackedLinear(groups.dequantize())
        layer.append((Int4GroupwiseLinear(groups, dense, max_m=1 << 30, act_dtype=torch.float32,
                                          use_f32=True), dense, k))
    q8 = torch.randint(-127, 128, HEAD, generator=g, dtype=torch.int8)
    s8 = (torch.rand(HEAD[0], HEAD[1] // 32, generator=g) * 0.01).half().float()
    groups8 = Int8Groups(q8, s8)
    head = Int8GroupwiseLinear(groups8, None, max_m=8, act_dtype=torch.float32, use_f32=True)
    head_dense = PrepackedLinear(groups8.dequantize())
    info = machine_info()
    flags = [f for f, on in info["cpu_flags"].items() if on]
    print(f"CPU {info['cpu']} ({', '.join(flags)}), threads {torch.get_num_threads()}, "
          f"load {info['load_avg_1m']:.2f}")
    print(f"{'rows':>4} {'layer f32 groups us':>20} {'layer dense us':>15} {'ratio':>6}"
          f" {'head int8 us':>13} {'head dense us':>14} {'ratio':>6}")
    with torch.inference_mode():
        for rows in args.rows:
            xs = {k: torch.randn(rows, k, generator=g) for _, k in LAYER}
            new = sum(best_us(lambda: lin.small(xs[k]), args.calls, args.rounds)
                      for lin, _, k in layer)
            old = sum(best_us(lambda: dense(xs[k]), args.calls, args.rounds)
                      for _, dense, k in layer)
            xh = torch.randn(rows, HEAD[1], generator=g)
            hn = best_us(lambda: head.small(xh), max(args.calls // 10, 3), args.rounds)
            ho = best_us(lambda: head_dense(xh), max(args.calls // 10, 3), args.rounds)
            print(f"{rows:4d} {new:20.1f} {old:15.1f} {old / new:6.2f} {hn:13.1f} {ho:14.1f}"
                  f" {ho / hn:6.2f}")


if __name__ == "__main__":
    main()
