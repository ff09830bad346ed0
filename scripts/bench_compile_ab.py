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
the graph's kernels). `--before-style` adds a third mode: graphs made as they were before
2026-12-07 14:00 UTC (frozen, replayed through dynamo with `skip_guard_eval_unsafe`), for
the comparison in docs/benchmarks.md.
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
from radixlm.executor.decode_graph_runner import DecodeGraphRunner
from radixlm.models.loader import resolve_model_path


class BeforeStyleGraph:
    """A decode graph made as before 2026-12-07 14:00 UTC (the `Graph` protocol)."""

    def __init__(self) -> None:
        self.fn = None

    def capture(self, fn):
        import torch._inductor.config as inductor_config

        # Its own code object: dynamo's cache entries stay apart from the runner's graphs.
        self.fn = torch.compile(lambda: fn(), fullgraph=True, dynamic=False)
        with torch._dynamo.config.patch(recompile_limit=64), \
                inductor_config.patch(freezing=True):
            return self.fn()

    def replay(self):
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            return self.fn()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--cpp-wrapper", action="store_true")
    ap.add_argument("--before-style", action="store_true")
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

    modes = {"compiled": use(graphs), "eager": use(None)}
    if args.before_style:
        before = DecodeGraphRunner(runner, sizes, BeforeStyleGraph, kind="before-style graphs")
        modes["before-style"] = use(before)
    runs = interleaved_modes(engine, modes, sizes, args.rounds, decode_steps=args.steps)
    steps = {key: [statistics.median(r.decode_step_s) * 1e3 for r in rs]
             for key, rs in runs.items()}
    runner.decode_graphs = graphs
    engine.check_invariant()
    for bs in sizes:
        c, e = steps[(bs, "compiled")], steps[(bs, "eager")]
        print(f"batch {bs:3d}: compiled {' '.join(f'{x:.2f}' for x in c)} ms, eager "
              f"{' '.join(f'{x:.2f}' for x in e)} ms; eager / compiled (medians) "
              f"{statistics.median(e) / statistics.median(c):.3f}")
        if args.before_style:
            b = steps[(bs, "before-style")]
            print(f"           before-style {' '.join(f'{x:.2f}' for x in b)} ms; eager / "
                  f"before-style {statistics.median(e) / statistics.median(b):.3f}, "
                  f"before-style / compiled {statistics.median(b) / statistics.median(c):.3f}")


if __name__ == "__main__":
    main()
