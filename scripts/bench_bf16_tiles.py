"""bf16 GEMMs on AMX tiles (radixlm's `bf16_tiles` kernel, TiledBf16Linear) against oneDNN's
prepacked GEMM (PrepackedLinear), per decoder layer of SmolLM2-135M's or Gemma 3 270M's
shapes, with the weights as a decode step meets them: `--layers` distinct copies of every
projection called in turn (30 layers of SmolLM2: 212 MB, past the caches of most CPUs),
so each call streams its weight from memory. The two methods alternate per round; the
median round per method is printed (microseconds per layer), and their ratio.

    PYTHONPATH=$PWD python scripts/bench_bf16_tiles.py [--rows 8 16 32 64 256 1024]
        [--layers 30] [--rounds 7] [--shapes smollm2|gemma3]

Needs a CPU with AMX-BF16 (the kernel refuses elsewhere).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from radixlm.models.linear.bf16_tiles import TiledBf16Linear, bf16_tiles_kernel
from radixlm.models.linear.method import PrepackedLinear

# (out, in) of one decoder layer's projections; q|k|v and gate|up fused as the models do.
SHAPES = {"smollm2": [(960, 576), (576, 576), (3072, 576), (576, 1536)],
          "gemma3": [(1536, 640), (640, 1024), (4096, 640), (640, 2048)]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[8, 16, 32, 64, 256, 1024])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--shapes", choices=sorted(SHAPES), default="smollm2")
    args = ap.parse_args()
    if bf16_tiles_kernel() is None:
        raise SystemExit("no AMX-BF16 tiles on this CPU (or the kernel did not build)")
    g = torch.Generator().manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layer = []
        for n, k in SHAPES[args.shapes]:
            w = (torch.randn(n, k, generator=g) * 0.02).bfloat16()
            layer.append((k, PrepackedLinear(w), TiledBf16Linear(w)))
        layers.append(layer)
    print(f"threads {torch.get_num_threads()}, {args.shapes} shapes, {args.layers} layers "
          "of distinct weights, us per layer (median round)")
    print(f"{'rows':>5} {'oneDNN':>9} {'AMX tiles':>10} {'tiles / oneDNN':>15} {'equal':>6}")
    with torch.inference_mode():
        for rows in args.rows:
            xs = {k: torch.randn(rows, k, generator=g).bfloat16() for k in {k for k, *_ in layers[0]}}
            k, onednn, tiles = layers[0][2]
            equal = torch.equal(onednn(xs[k]), tiles(xs[k]))
            times: dict[str, list[float]] = {"oneDNN": [], "tiles": []}
            for _ in range(args.rounds):
                for name, pick in (("oneDNN", 1), ("tiles", 2)):
                    t0 = time.perf_counter()
                    for layer in layers:
                        for entry in layer:
                            entry[pick](xs[entry[0]])
                    times[name].append((time.perf_counter() - t0) / args.layers * 1e6)
            a, b = statistics.median(times["oneDNN"]), statistics.median(times["tiles"])
            print(f"{rows:5d} {a:9.1f} {b:10.1f} {a / b:14.2f}x {str(equal):>6}", flush=True)


if __name__ == "__main__":
    main()
