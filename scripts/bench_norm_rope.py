"""Per-call time of the norm_rope kernels (SiLU * up, RMSNorm) against torch's code, and
optionally against an older build of the kernel (`--baseline-so`, a .so from
~/.cache/radixlm/cpu_kernels/norm_rope-*/), one process, best of `--rounds`.

    python scripts/bench_norm_rope.py --threads 1 [--baseline-so OLD.so]
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from radixlm.cpu_kernels.build import load_kernel


def _load_so(path: str):
    name = path.rsplit("/", 1)[-1].split(".")[0]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def best_us(f: Callable[[], object], rounds: int, calls: int = 100) -> float:
    for _ in range(10):
        f()
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            f()
        best = min(best, (time.perf_counter() - t) / calls)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", default="1,8,32")
    ap.add_argument("--inter", type=int, default=1536, help="SmolLM2's intermediate size")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline-so", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    kernels = {"kernel": load_kernel("norm_rope")}
    if a.baseline_so:
        kernels["baseline"] = _load_so(a.baseline_so)
    print(f"torch {torch.__version__}, threads {a.threads}; us per call, best of {a.rounds}")
    for m in (int(r) for r in a.rows.split(",")):
        gu = torch.randn(m, 2 * a.inter, dtype=torch.bfloat16)
        x, w = gu[:, :a.inter].contiguous(), torch.randn(a.inter, dtype=torch.bfloat16)
        row = {"torch silu*up": best_us(lambda: F.silu(gu[:, :a.inter]) * gu[:, a.inter:],
                                         a.rounds),
               "torch rms": best_us(lambda: F.rms_norm(x, (a.inter,), w, 1e-6), a.rounds)}
        for name, k in kernels.items():
            row[f"{name} silu*up"] = best_us(lambda: k.silu_mul(gu), a.rounds)
            row[f"{name} rms"] = best_us(lambda: k.rms_norm(x, w, 1e-6), a.rounds)
        print(f"rows {m:4d}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()))


if __name__ == "__main__":
    main()
