"""Times the q5_bf16 kernel (Q5GroupwiseLinear.small) against the int8_groups kernel
(Int8GroupwiseLinear.small, the path Q5_0 took before) and the dense bf16 projection
(oneDNN prepacked) at 1, 4 and 8 rows on the shapes of Gemma 3 270M's Q5_0 tensors.

Random Q5_0-like weights (q in -16..15, float16 scales) of the real shapes; the median of
`--repeat` calls after a warm-up (and the fastest, for the loaded-machine reader); GB/s is
each form's bytes over the median.

    PYTHONPATH=$PWD RADIXLM_CACHE_DIR=... python scripts/bench_q5_kernel.py [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from radixlm.models.linear.int8_groups import Int8Groups, Int8GroupwiseLinear
from radixlm.models.linear.method import PrepackedLinear
from radixlm.models.linear.q5_bf16 import Q5GroupwiseLinear

SHAPES = [  # (name, out, in): HF [out, in]
    ("gemma q_proj", 1024, 640),
    ("gemma qkv (fused)", 1536, 640),
    ("gemma gate_up (fused)", 4096, 640),
]


def timed(fn, x, repeat: int) -> tuple[float, float]:
    """(median, min) ms of `repeat` calls after two warm-up calls."""
    fn(x)
    fn(x)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, min(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--repeat", type=int, default=201)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"threads {torch.get_num_threads()}; ms = median (min)")
    print(f"{'shape':22s} {'M':>2s} {'q5 ms':>15s} {'GB/s':>5s} {'int8 ms':>15s} {'GB/s':>5s} "
          f"{'bf16 ms':>15s} {'int8/q5':>7s} {'bf16/q5':>7s}")
    for name, n, k in SHAPES:
        q = torch.randint(-16, 16, (n, k), dtype=torch.int8)
        s = (torch.rand(n, k // 32) * 1e-2 + 1e-3).half().float()
        groups = Int8Groups(q, s, 32)
        dense = PrepackedLinear(groups.dequantize().bfloat16())
        q5 = Q5GroupwiseLinear(groups, dense, max_m=max(args.rows))
        i8 = Int8GroupwiseLinear(groups, dense, max_m=max(args.rows))
        for m in args.rows:
            x = torch.randn(m, k).bfloat16()
            with torch.inference_mode():
                t5 = timed(q5.small, x, args.repeat)
                t8 = timed(i8.small, x, args.repeat)
                td = timed(dense.forward, x, args.repeat)
            print(f"{name:22s} {m:2d} {t5[0]:7.4f} ({t5[1]:.4f}) "
                  f"{q5.kernel_bytes() / t5[0] / 1e6:5.1f} {t8[0]:7.4f} ({t8[1]:.4f}) "
                  f"{i8.kernel_bytes() / t8[0] / 1e6:5.1f} {td[0]:7.4f} ({td[1]:.4f}) "
                  f"{t8[0] / t5[0]:6.2f}x {td[0] / t5[0]:6.2f}x", flush=True)


if __name__ == "__main__":
    main()
