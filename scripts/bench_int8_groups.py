"""Times the int8_groups kernel (Int8GroupwiseLinear.small) against the dense bf16 head /
projection (oneDNN prepacked) at 1, 2, 4 and 8 rows on the shapes of Gemma 3 270M's
Q8_0/Q5_0/Q6_K tensors and the tied heads (Gemma 3 262144 x 640, SmolLM2 49152 x 576).

Random weights of the real shapes; the fastest of `--repeat` calls after a warm-up; GB/s is the
int8 form's bytes (q + scales) over that time, or the bf16 weight's for the dense column.

    PYTHONPATH=$PWD RADIXLM_CACHE_DIR=... python scripts/bench_int8_groups.py \
        [--threads 1] [--baseline-so OLD.so]

--baseline-so: an int8_groups library built from an earlier source (the kernel cache keeps
each version's .so), timed side by side in the same process with its float32-input call.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import time

import torch

from radixlm.models.linear.int8_groups import Int8Groups, Int8GroupwiseLinear
from radixlm.models.linear.method import PrepackedLinear

SHAPES = [  # (name, out, in, group)
    ("gemma q_proj", 1024, 640, 32),
    ("gemma gate/up", 2048, 640, 32),
    ("gemma down (Q6_K)", 640, 2048, 16),
    ("gemma head", 262144, 640, 32),
    ("smollm2 head", 49152, 576, 32),
]


def best_ms(fn, x, repeat: int) -> float:
    fn(x)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3  # the least disturbed call (shared, loaded machines)


def load_so(path: str):
    name = path.rsplit("/", 1)[-1].split(".")[0]
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--repeat", type=int, default=21)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--only", default="", help="shapes whose name contains this")
    ap.add_argument("--baseline-so", default="")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    old = load_so(args.baseline_so) if args.baseline_so else None
    torch.manual_seed(0)
    print(f"threads {torch.get_num_threads()}")
    print(f"{'shape':20s} {'M':>2s} {'int8 ms':>8s} {'GB/s':>6s} {'bf16 ms':>8s} {'GB/s':>6s} "
          f"{'int8/bf16 speed':>15s}" + ("   old ms  new/old speed" if old else ""))
    for name, n, k, g in [s for s in SHAPES if args.only in s[0]]:
        q = torch.randint(-127, 128, (n, k), dtype=torch.int8)
        s = (torch.rand(n, k // g) * 1e-2 + 1e-3).half().float()
        groups = Int8Groups(q, s, g)
        dense = PrepackedLinear(groups.dequantize().bfloat16())
        lin = Int8GroupwiseLinear(groups, dense, max_m=max(args.rows))
        int8_bytes = lin.kernel_bytes()
        bf16_bytes = n * k * 2
        for m in args.rows:
            x = torch.randn(m, k).bfloat16()
            with torch.inference_mode():
                ti = best_ms(lin.small, x, args.repeat)
                td = best_ms(dense.forward, x, args.repeat)
                to = best_ms(lambda v: old.int8_group_matmul(v.float(), q, lin.s, g), x,
                               args.repeat) if old else 0.0
            line = (f"{name:20s} {m:2d} {ti:8.3f} {int8_bytes / ti / 1e6:6.1f} {td:8.3f} "
                    f"{bf16_bytes / td / 1e6:6.1f} {td / ti:14.2f}x")
            if old:
                line += f" {to:8.3f} {to / ti:13.2f}x"
            print(line, flush=True)


if __name__ == "__main__":
    main()
