"""Quantized groups dequantized into AMX B tiles (`bf16_tiles_q4_*`, `_q5_*`, `_q8_*`)
against the bf16 tile GEMM on the same weights dequantized once (`bf16_tiles_matmul` /
`_gated`: the dense fallback they replace), on a model's projections per layer (a gated
MLP's gate_up through the fused epilogue), layers of distinct random weights so that each
call reads its weight from memory as a decode step does.

    PYTHONPATH=$PWD python scripts/bench_quant_tiles.py [--format q4|q5|q8|q6k]
        [--shapes smollm2|gemma3|gemma3-head] [--rows 1 9 16 32 64 256 1024]
        [--rounds 7] [--layers N]

q4: Q4_1-like groups (int4_bf16 layout); q5: Q5_0 (q5_bf16 layout); q8: Q8_0 (int8
groups of 32, row-major); q6k: Q6_K-like int8 groups of 16. Shapes: SmolLM2-135M's four
projections (30 layers), Gemma 3 270M's (18 layers), or Gemma 3's 262144 x 640 LM head
(1 "layer"). Per row count the rounds alternate the two formats (A B, B A, ...); each
round times three passes over the layers and keeps the fastest; printed: microseconds per
layer (min and median over rounds) and the median of the rounds' ratios bf16 / quantized.
Needs a CPU with AMX-BF16 (the tile kernel).
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
from radixlm.models.linear.int8_groups import Int8Groups
from radixlm.models.linear.q5_bf16_blocks import pack_q5_blocks, q5_scales

# (out, in, gated) per layer, and the layer count
SHAPES = {
    "smollm2": ([(960, 576, False), (576, 576, False), (3072, 576, True), (576, 1536, False)], 30),
    "gemma3": ([(1536, 640, False), (640, 1024, False), (4096, 640, True), (640, 2048, False)], 18),
    "gemma3-head": ([(262144, 640, False)], 1),
}


def make_weight(fmt: str, n: int, k: int, g: torch.Generator) -> tuple[torch.Tensor, tuple]:
    """(the dense bf16 tiles, the quantized operands) of one random [n, k] weight."""
    def scales(groups: int) -> torch.Tensor:
        return (torch.rand(n, groups, generator=g) * 0.02 + 1e-3).half().float()

    if fmt == "q4":
        q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
        d = scales(k // 32)
        m = (-(8 + 4 * torch.rand(n, k // 32, generator=g)) * d).half().float()
        bd, bm = block_scales(d, m)
        dense = Int4Groups(q, d, m, 32).dequantize()
        return pack_tiles(dense.bfloat16()), (pack_bf16_blocks(q), bd, bm, offset_exact(bd, bm))
    if fmt == "q5":
        q = torch.randint(-16, 16, (n, k), generator=g, dtype=torch.int8)
        d = scales(k // 32)
        dense = Int8Groups(q, d, 32).dequantize()
        return pack_tiles(dense.bfloat16()), (pack_q5_blocks(q.to(torch.int16) + 16), q5_scales(d))
    group = 16 if fmt == "q6k" else 32
    lim = 32 if fmt == "q6k" else 128
    q = torch.randint(-lim, lim, (n, k), generator=g, dtype=torch.int8)
    s = scales(k // group)
    return pack_tiles(Int8Groups(q, s, group).dequantize().bfloat16()), (q, s, group)


def make_layers(fmt: str, shapes: list, count: int) -> list[list[tuple]]:
    g = torch.Generator().manual_seed(0)
    return [[(n, k, gated, *make_weight(fmt, n, k, g)) for n, k, gated in shapes]
            for _ in range(count)]


def call(kernel, fmt: str, x: torch.Tensor, n: int, gated: bool, dense: torch.Tensor,
         ops: tuple) -> torch.Tensor:
    if fmt == "bf16":
        return (kernel.bf16_tiles_gated(x, dense, n // 2, False) if gated
                else kernel.bf16_tiles_matmul(x, dense, n, None))
    if fmt == "q4":
        q, d, m, exact = ops
        return (kernel.bf16_tiles_q4_gated(x, q, d, m, n // 2, False, exact) if gated
                else kernel.bf16_tiles_q4_matmul(x, q, d, m, n, None, exact))
    if fmt == "q5":
        q, d = ops
        return (kernel.bf16_tiles_q5_gated(x, q, d, n // 2, False) if gated
                else kernel.bf16_tiles_q5_matmul(x, q, d, n, None))
    q, s, group = ops
    return (kernel.bf16_tiles_q8_gated(x, q, s, group, False) if gated
            else kernel.bf16_tiles_q8_matmul(x, q, s, group, None))


def time_layers(kernel, layers: list, rows: int, fmt: str, weights: str) -> float:
    """Fastest of three passes over every layer, microseconds per layer."""
    xs = {k: torch.randn(rows, k).bfloat16() for k in {s[1] for s in layers[0]}}

    def one_pass() -> None:
        for layer in layers:
            for n, k, gated, dense, ops in layer:
                call(kernel, fmt if fmt == "bf16" else weights, xs[k], n, gated, dense, ops)

    one_pass()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        one_pass()
        best = min(best, time.perf_counter() - t0)
    return best / len(layers) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--format", choices=["q4", "q5", "q8", "q6k"], default="q4")
    ap.add_argument("--shapes", choices=sorted(SHAPES), default="smollm2")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 9, 16, 32, 64, 256, 1024])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--layers", type=int, default=None, help="default: the model's")
    args = ap.parse_args()
    kernel = bf16_tiles_kernel()
    if kernel is None:
        raise SystemExit("needs AMX-BF16 tiles (bf16_tiles kernel)")
    shapes, count = SHAPES[args.shapes]
    layers = make_layers(args.format, shapes, args.layers or count)
    print(f"threads {torch.get_num_threads()}, {args.shapes}, {len(layers)} layers, "
          f"{args.format}, {args.rounds} rounds")
    for rows in args.rows:
        t: dict[str, list[float]] = {"bf16": [], "quant": []}
        for r in range(args.rounds):
            for fmt in ("bf16", "quant") if r % 2 == 0 else ("quant", "bf16"):
                t[fmt].append(time_layers(kernel, layers, rows, fmt, args.format))
        ratios = [b / q for b, q in zip(t["bf16"], t["quant"])]
        print(f"rows {rows:5d}: bf16 tiles {min(t['bf16']):8.0f} / {statistics.median(t['bf16']):8.0f}"
              f" us, {args.format} tiles {min(t['quant']):8.0f} / {statistics.median(t['quant']):8.0f}"
              f" us (min / median per layer); bf16 / {args.format} "
              f"{statistics.median(ratios):.2f}x (rounds {min(ratios):.2f}-{max(ratios):.2f})",
              flush=True)


if __name__ == "__main__":
    main()
