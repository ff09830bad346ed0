"""Side by side in one process: the groups_f32 C++ kernel (int4 / int8 groups x float32
activations, AVX2; its int4 words x int8 activations, "f32 groups q8": a float32 run's
`--int4-int8-activations`) against the dense float32 weights it replaces (oneDNN
prepacked) and against the kernels that quantize x to int8 per group of 32 in their own
layouts (int4_groups: bf16 runs' `--int4-int8-activations`; int8_groups), on SmolLM2-135M's shapes:
one decoder layer's four projections (Q4_1-like int4 groups; x 30 layers a decode step)
and the tied 49152 x 576 head (Q8_0-like int8 groups), at each row count; methods timed
in turn, best of `--rounds` batches of `--calls` calls.

    PYTHONPATH=$PWD python scripts/bench_groups_f32.py [--rows 1 4 16 32 64] [--threads 2]
    PYTHONPATH=$PWD python scripts/bench_groups_f32.py --layers 30 --rows 1 4   # from DRAM

One layer's weights (2 MB as int4 groups) stay in this CPU's L3 across calls; `--layers
N` times N distinct layers in turn (30: a real step's 66 MB, read from memory) and
reports the int4 layers' time per layer. Whole decode steps: `scripts/bench_q5_decode_ab.py
--dtype float32`.
"""

from __future__ import annotations

import argparse
import time

import torch

from radixlm.bench.report import machine_info
from radixlm.models.linear.groups_f32 import groups_f32_kernel
from radixlm.models.linear.int4 import Int4GroupwiseLinear, int4_blocks_kernel
from radixlm.models.linear.int4_groups import Int4Groups
from radixlm.models.linear.int8_groups import Int8Groups, Int8GroupwiseLinear, int8_groups_kernel
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


def layer_methods(groups: Int4Groups, dense: PrepackedLinear) -> dict[str, object]:
    """One projection's methods: groups_f32 (x float32, x int8), dense float32, int4_groups
    (x int8) if built."""
    out = {"f32 groups": Int4GroupwiseLinear(groups, dense, max_m=1 << 30,
                                             act_dtype=torch.float32, use_f32=True),
           "dense": dense}
    out["f32 groups q8"] = Int4GroupwiseLinear(groups, dense, max_m=1 << 30,
                                               act_dtype=torch.float32, use_f32=True,
                                               int8_activations=True)
    if int4_blocks_kernel() is not None:
        out["int8 x"] = Int4GroupwiseLinear(groups, dense, max_m=1 << 30,
                                            act_dtype=torch.float32, use_blocks=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--layers", type=int, default=1,
                    help="distinct layers timed in turn (30: a step's int4 weights, from DRAM)")
    args = ap.parse_args()
    if groups_f32_kernel() is None:
        raise SystemExit("groups_f32 did not build here (needs AVX2, FMA, F16C)")
    if args.threads:
        torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    layers = []  # [layer][projection] -> (methods, k)
    for _ in range(args.layers):
        layer = []
        for n, k in LAYER:
            q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
            d = (torch.rand(n, k // 32, generator=g) * 0.01).half().float()
            m = (-8 * d).half().float()
            groups = Int4Groups(q, d, m)
            layer.append((layer_methods(groups, PrepackedLinear(groups.dequantize())), k))
        layers.append(layer)
    names = list(layers[0][0][0])
    q8 = torch.randint(-127, 128, HEAD, generator=g, dtype=torch.int8)
    s8 = (torch.rand(HEAD[0], HEAD[1] // 32, generator=g) * 0.01).half().float()
    groups8 = Int8Groups(q8, s8)
    head = {"f32 groups": Int8GroupwiseLinear(groups8, None, max_m=8, act_dtype=torch.float32,
                                              use_f32=True),
            "dense": PrepackedLinear(groups8.dequantize())}
    if int8_groups_kernel() is not None:
        head["int8 x"] = Int8GroupwiseLinear(groups8, None, max_m=1 << 30,
                                             act_dtype=torch.float32)
    info = machine_info()
    flags = [f for f, on in info["cpu_flags"].items() if on]
    print(f"CPU {info['cpu']} ({', '.join(flags)}), threads {torch.get_num_threads()}, "
          f"load {info['load_avg_1m']:.2f}, {args.layers} distinct layer(s); us per layer "
          f"(its 4 projections) and per head call; ratio: dense over f32 groups")
    print(f"{'rows':>4} " + " ".join(f"{'layer ' + n:>15}" for n in names) + f" {'ratio':>6} "
          + " ".join(f"{'head ' + n:>15}" for n in head) + f" {'ratio':>6}")

    def call(method, x):
        return method.small(x) if hasattr(method, "small") else method(x)

    with torch.inference_mode():
        for rows in args.rows:
            xs = {k: torch.randn(rows, k, generator=g) for _, k in LAYER}
            lay = {}
            for name in names:
                def sweep(name=name):
                    for layer in layers:
                        for methods, k in layer:
                            call(methods[name], xs[k])
                lay[name] = best_us(sweep, max(args.calls // args.layers, 1),
                                    args.rounds) / args.layers
            xh = torch.randn(rows, HEAD[1], generator=g)
            hd = {name: best_us(lambda: call(h, xh), max(args.calls // 10, 3), args.rounds)
                  for name, h in head.items()}
            print(f"{rows:4d} " + " ".join(f"{lay[n]:15.1f}" for n in names)
                  + f" {lay['dense'] / lay['f32 groups']:6.2f} "
                  + " ".join(f"{hd[n]:15.1f}" for n in head)
                  + f" {hd['dense'] / hd['f32 groups']:6.2f}", flush=True)


if __name__ == "__main__":
    main()
