"""Per linear method of a GGUF model as radixlm loads it (`--quantization auto`, bf16):
microseconds per call at M rows, the bytes it reads, and the GB/s that makes; methods of
the same kind and shape summed over the layers. With `--prefetch N ...`, the LM head (an
int8-group method) also on int8_groups kernels built with those prefetch distances
(cpu_kernels/prefetch.h; 0: none), side by side in one process.

    PYTHONPATH=$PWD python scripts/bench_linear_methods.py [--model GGUF] [--rows 1 4]
        [--prefetch 0 1024 4096]

Calls repeat back to back, so a layer's weights (and on a large L3 even the head) may be
cache-resident: whole decode steps (`scripts/bench_ab_one_batch.sh`) are the figure to
hold a change to.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from pathlib import Path

import torch

from radixlm.cpu_kernels.build import build_extension, load_kernel
from radixlm.models import load_model
from radixlm.models.linear import LinearPolicy
from radixlm.models.linear.policy import top_level_methods
from radixlm.models.packaged import gemma3_270m_gguf

KERNELS = Path(__file__).resolve().parents[1] / "radixlm" / "cpu_kernels"


def median_seconds(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def per_method(model: torch.nn.Module, rows: int, repeat: int) -> None:
    agg: dict[tuple, list] = collections.defaultdict(lambda: [0, 0.0, 0])
    with torch.inference_mode():
        for m in top_level_methods(model):
            x = torch.randn(rows, m.in_features).bfloat16()
            t = median_seconds(lambda: m(x), repeat)
            a = agg[(type(m).__name__, m.in_features, m.out_features)]
            a[0], a[1], a[2] = a[0] + 1, a[1] + t, a[2] + m.bytes_read(rows)
    print(f"rows {rows}:")
    for (cls, k, n), (count, t, b) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"  {cls:22s} {k:5d} -> {n:6d} x{count:3d}: {t / count * 1e6:9.1f} us/call, "
              f"{t * 1e3:6.2f} ms in all, {b / count / 1e6:8.3f} MB/call, {b / t / 1e9:5.1f} GB/s")
    print(f"  sum {sum(a[1] for a in agg.values()) * 1e3:.2f} ms")


def prefetch_sweep(model: torch.nn.Module, distances: list[int], rows_list: list[int],
                   repeat: int) -> None:
    head = next(m for m in top_level_methods(model) if hasattr(m, "q") and m.out_features >= 32768)
    mods = {"built": load_kernel("int8_groups")}
    for n in distances:
        mods[f"prefetch {n}"] = build_extension(f"int8_groups_prefetch{n}", KERNELS / "int8_groups.cpp",
                                                (f"-DRADIXLM_PREFETCH_BYTES={n}",))
    for rows in rows_list:
        x = torch.randn(rows, head.in_features).bfloat16()
        times: dict[str, list[float]] = {k: [] for k in mods}
        for _ in range(repeat):  # interleaved
            for k, mod in mods.items():
                times[k].append(median_seconds(
                    lambda: mod.int8_group_matmul(x, head.q, head.s, head.group_size), 1))
        for k, ts in times.items():
            t = statistics.median(ts)
            print(f"head {head.out_features} x {head.in_features}, rows {rows}, {k:14s}: "
                  f"{t * 1e3:6.2f} ms ({head.kernel_bytes() / t / 1e9:5.1f} GB/s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a GGUF (default: Gemma 3 270M Q4_K_M)")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--repeat", type=int, default=40)
    ap.add_argument("--prefetch", type=int, nargs="*", default=[])
    a = ap.parse_args()
    model, _ = load_model(a.model or gemma3_270m_gguf(), torch.bfloat16, "cpu",
                          linear_policy=LinearPolicy("auto"))
    print(f"threads {torch.get_num_threads()}")
    for rows in a.rows:
        per_method(model, rows, a.repeat)
    if a.prefetch:
        prefetch_sweep(model, a.prefetch, a.rows, 15)


if __name__ == "__main__":
    main()
