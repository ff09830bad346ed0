"""Compiled decode (`--enable-torch-compile`) vs the eager forward, one engine, steps interleaved.

    PYTHONPATH=$PWD python scripts/bench_compile_ab.py [--model GGUF] [--batch-sizes 1 32]
                                                       [--rounds 3] [--cpp-wrapper]

One engine with --enable-torch-compile, its decode graphs made for exactly the measured
batch sizes (not the whole 1, 2, 4, ... ladder: each size is a compile); then per round
and batch size one static batch of fresh 128-token prompts decodes 16 steps with the
graphs and one with them set aside (the eager forward, the same weights, kernels and
pools; `one_batch.interleaved_modes`), so a loaded machine hits both alike. Prints the
graphs' compile time, the median decode step per round and mode, and eager / compiled
per batch size. `--cpp-wrapper` compiles with inductor's C++ wrapper (no Python between
the graph's kernels).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

import torch

import radixlm.executor.model_runner as model_runner
from radixlm.bench.one_batch import interleaved_modes, static_batch_args
from radixlm.engine import Engine
from radixlm.models.loader import resolve_model_path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--cpp-wrapper", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    sizes = sorted(set(args.batch_sizes))
    # Graphs for the measured sizes only.
    model_runner.capture_batch_sizes = lambda max_bs: sizes
    if args.cpp_wrapper:
        import torch._inductor.config as inductor_config
        inductor_config.cpp_wrapper = True
    t0 = time.perf_counter()
    engine = Engine(resolve_model_path(args.model), enable_torch_compile=True,
                    torch_compile_max_bs=sizes[-1],
                    **static_batch_args(sizes[-1], 128, args.steps))
    print(f"engine with graphs for {sizes} ready in {time.perf_counter() - t0:.1f} s "
          f"(threads {torch.get_num_threads()})")
    runner = engine.scheduler.runner
    graphs = runner.decode_graphs

    def use(g):
        return lambda: setattr(runner, "decode_graphs", g)

    runs = interleaved_modes(engine, {"compiled": use(graphs), "eager": use(None)}, sizes,
                             args.rounds, decode_steps=args.steps)
    steps = {key: [statistics.median(r.decode_step_s) * 1e3 for r in rs]
             for key, rs in runs.items()}
    runner.decode_graphs = graphs
    engine.check_invariant()
    for bs in sizes:
        c, e = steps[(bs, "compiled")], steps[(bs, "eager")]
        print(f"batch {bs:3d}: compiled {' '.join(f'{x:.2f}' for x in c)} ms, eager "
              f"{' '.join(f'{x:.2f}' for x in e)} ms; eager / compiled (medians) "
              f"{statistics.median(e) / statistics.median(c):.3f}")


if __name__ == "__main__":
    main()
