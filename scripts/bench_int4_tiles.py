"""4-bit groups dequantized into AMX B tiles (`bf16_tiles_q4_matmul` / `_gated`) against
the bf16 tile GEMM on the same weights dequantized once (`bf16_tiles_matmul` / `_gated`:
the dense fallback they replace for int4 layers), on SmolLM2-135M's four projections per
layer (the gated MLP's gate_up through the fused epilogue), 30 layers of distinct random
Q4_1-like weights so that each call reads its weight from memory as a decode step does.

    PYTHONPATH=$PWD python scripts/bench_int4_tiles.py [--rows 1 9 16 32 64 256 1024]
        [--rounds 7] [--layers 30]

Per row count: the rounds alternate the two formats (A B, B A, ...); each round times
three passes over the layers and keeps the fastest; printed: microseconds per layer (min
and median over rounds) and the median of the rounds' ratios bf16 / 4-bit. Needs a CPU
with AMX-BF16 (the tile kernel).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from radixlm.models.linear.bf16_tiles import bf16_tiles_kernel, pack_tiles
from radixlm.models.linear.int4 import offset_exact
from radixlm.models.linear.int4_bf16_blocks import block_scales, pack_bf16_blocks
from radixlm.models.linear.int4_groups import Int4Groups

# (out, in, gated): q|k|v, o, gate|up (the fused SiLU * up), down
SHAPES = [(960, 576, False), (576, 576, False), (3072, 576, True), (576, 1536, False)]


def make_layers(count: int) -> list[list[tuple]]:
    g = torch.Generator().manual_seed(0)
    layers = []
    for _ in range(count):
        layer = []
        for n, k, gated in SHAPES:
            q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
            d = (torch.rand(n, k // 32, generator=g) * 0.02 + 1e-3).half().float()
            m = (-(8 + 4 * torch.rand(n, k // 32, generator=g)) * d).half().float()
            bd, bm = block_scales(d, m)
            dense = pack_tiles(Int4Groups(q, d, m, 32).dequantize().to(torch.bfloat16))
            layer.append((n, k, gated, dense, pack_bf16_blocks(q), bd, bm, offset_exact(bd, bm)))
        layers.append(layer)
    return layers


def time_layers(kernel, layers: list, rows: int, fmt: str) -> float:
    """Fastest of three passes over every layer, microseconds per layer."""
    xs = {k: torch.randn(rows, k).bfloat16() for k in (576, 1536)}

    def one_pass() -> None:
        for layer in layers:
            for n, k, gated, dense, q, d, m, exact in layer:
                x = xs[k]
                if fmt == "bf16":
                    (kernel.bf16_tiles_gated(x, dense, n // 2, False) if gated
                     else kernel.bf16_tiles_matmul(x, dense, n, None))
                else:
                    (kernel.bf16_tiles_q4_gated(x, q, d, m, n // 2, False, exact) if gated
                     else kernel.bf16_tiles_q4_matmul(x, q, d, m, n, None, exact))

    one_pass()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        one_pass()
        best = min(best, time.perf_counter() - t0)
    return best / len(layers) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 9, 16, 32, 64, 256, 1024])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--layers", type=int, default=30)
    args = ap.parse_args()
    kernel = bf16_tiles_kernel()
    if kernel is None:
        raise SystemExit("needs AMX-BF16 tiles (bf16_tiles kernel)")
    layers = make_layers(args.layers)
    print(f"threads {torch.get_num_threads()}, {args.layers} layers, {args.rounds} rounds")
    for rows in args.rows:
        t: dict[str, list[float]] = {"bf16": [], "q4": []}
        for r in range(args.rounds):
            for fmt in ("bf16", "q4") if r % 2 == 0 else ("q4", "bf16"):
                t[fmt].append(time_layers(kernel, layers, rows, fmt))
        ratios = [b / q for b, q in zip(t["bf16"], t["q4"])]
        bf16 = f"{min(t['bf16']):7.0f} / {statistics.median(t['bf16']):7.0f}"
        print(f"rows {rows:5d}: bf16 tiles {bf16}"
              f" us, 4-bit tiles {min(t['q4']):7.0f} / {statistics.median(t['q4']):7.0f} us"
              f" (min / median per layer); bf16 / 4-bit {statistics.median(ratios):.2f}x"
              f" (rounds {min(ratios):.2f}-{max(ratios):.2f})", flush=True)


if __name__ == "__main__":
    main()
