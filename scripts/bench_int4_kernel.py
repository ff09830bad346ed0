"""Side by side in one process: the int4_bf16 C++ kernel (bf16 activations, exact), the
int4_groups C++ kernel (int8 activations), aten's
int4pack kernel, the dense bf16 fallback (oneDNN prepacked) and, on an AMX CPU, int4_bf16's
AVX512-BF16 loops (`int4_bf16 loops`; `int4_bf16` is then its AMX tiles), on SmolLM2-135M's
projection shapes, for calls of M rows (bf16 activations, as the engine sends).

    PYTHONPATH=$PWD RADIXLM_CACHE_DIR=... python scripts/bench_int4_kernel.py \
        [--rows 1 2 4 8 16] [--threads 1 2] [--seconds 0.3]

Prints per shape, M and thread count the best microseconds per call (the methods timed
in turn) and the bytes of weight each method reads per call over that time (GB/s), and
a "layer" line: the sum of
the four projections of one decoder layer (x 30 layers: the int4 share of a decode step).
Random Q4_1-like weights (float16 d, m); the timings do not depend on the values.
"""

from __future__ import annotations

import argparse
import time

import torch

from radixlm.models.linear.int4 import Int4GroupwiseLinear
from radixlm.models.linear.int4_groups import Int4Groups
from radixlm.models.linear.method import PrepackedLinear

# SmolLM2-135M: hidden 576, 9 heads / 3 KV heads of 64, intermediate 1536; the model fuses
# q|k|v (960 rows) and gate|up (3072 rows).
SHAPES = {"qkv_proj": (960, 576), "o_proj": (576, 576), "gate_up_proj": (3072, 576),
          "down_proj": (576, 1536)}



def vector_loops_kernel():
    """On an AMX CPU (the built int4_bf16 kernel's path 2), the same kernel built without
    its AMX path (-DRADIXLM_INT4_AMX=0: the AVX512-BF16 loops other CPUs run); else None."""
    from radixlm.models.linear.int4 import int4_bf16_kernel

    built = int4_bf16_kernel()
    if built is None or built.int4_bf16_path() != 2:
        return None
    from tests.kernel_variants import load_variant

    return load_variant("int4_bf16", 1)


def _groups(n: int, k: int, g: torch.Generator) -> Int4Groups:
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    d = (torch.rand(n, k // 32, generator=g) * 0.02 + 1e-3).half().float()
    m = (-8 * d).half().float()
    return Int4Groups(q, d, m)


def _time_side_by_side(fns: list, x: torch.Tensor, seconds: float) -> list[float]:
    """Per fn, the best microseconds of one call (batches of 10 calls, the fns taken in
    turn so that each sees the same load; the best batch is the least disturbed one on a
    shared machine)."""
    for fn in fns:
        for _ in range(20):
            fn(x)
    best = [float("inf")] * len(fns)
    end = time.perf_counter() + seconds
    rounds = 0
    while time.perf_counter() < end or rounds < 5:
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(10):
                fn(x)
            best[i] = min(best[i], (time.perf_counter() - t0) / 10 * 1e6)
        rounds += 1
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--seconds", type=float, default=0.3)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    methods: dict[str, dict[str, object]] = {}
    vec = vector_loops_kernel()
    for name, (n, k) in SHAPES.items():
        groups = _groups(n, k, g)
        dense = PrepackedLinear(groups.dequantize().bfloat16())
        bf16 = Int4GroupwiseLinear(groups, dense, max_m=10**6, use_bf16=True)
        new = Int4GroupwiseLinear(groups, dense, max_m=10**6, use_blocks=True)
        aten = Int4GroupwiseLinear(groups, dense, max_m=10**6, use_blocks=False)
        methods[name] = {
            "int4_bf16": (bf16.small, bf16.kernel_bytes()),
            "int4_groups": (new.small, new.kernel_bytes()),
            "aten int4pack": (aten.small, aten.kernel_bytes()),
            "dense bf16": (dense.forward, n * k * 2),
        }
        if vec is not None:  # the AVX512-BF16 loops beside the AMX tiles
            loops = Int4GroupwiseLinear(groups, dense, max_m=10**6, use_bf16=True)
            loops._bf16 = vec
            methods[name]["int4_bf16 loops"] = (loops.small, loops.kernel_bytes())
    columns = list(methods["qkv_proj"])
    print(f"{'threads':>7} {'M':>3} {'shape':>13} " + "".join(
        f"{m:>22}" for m in columns) + "  bf16/aten bf16/dense")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for rows in args.rows:
            total = {m: 0.0 for m in columns}
            for name, (n, k) in SHAPES.items():
                x = torch.randn(rows, k, generator=g).bfloat16()
                meths = methods[name]
                times = _time_side_by_side([fn for fn, _ in meths.values()], x, args.seconds)
                cells = []
                for (meth, (_, nbytes)), us in zip(meths.items(), times):
                    total[meth] += us
                    cells.append(f"{us:9.1f} us {nbytes / us / 1e3:6.1f} GB/s")
                us = dict(zip(meths, times))
                us_new, us_aten, us_dense = us["int4_bf16"], us["aten int4pack"], us["dense bf16"]
                print(f"{threads:>7} {rows:>3} {name:>13} " + "".join(f"{c:>22}" for c in cells)
                      + f"   {us_aten / us_new:8.2f} {us_dense / us_new:9.2f}")
            print(f"{threads:>7} {rows:>3} {'layer':>13} " + "".join(
                f"{total[m]:9.1f} us {'':>12}" for m in total)
                + f"   {total['aten int4pack'] / total['int4_bf16']:8.2f}"
                f" {total['dense bf16'] / total['int4_bf16']:9.2f}")


if __name__ == "__main__":
    main()
