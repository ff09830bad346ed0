"""The eager decode step's per-layer Python and dispatch overhead, measured so that a
loaded machine still shows it:

    python scripts/bench_decode_overhead.py [--batch-size 1] [--steps 200] [--rounds 3]

Prints, for decode forwards of the default model on one thread: Python function calls
and nn.Module.__getattr__ calls per forward (cProfile: counts, independent of load), the
CPU time per forward, and the CPU time per forward with the int4 GEMMs and the LM head
stubbed (returning preallocated zeros), which leaves the overhead plus the small C++
kernels. Run it with PYTHONPATH of two checkouts alternately to compare them.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import torch


def stub_gemms() -> None:
    """Int4 GEMMs and the LM head -> zeros of their output's shape (same in any checkout)."""
    import radixlm.models.decoder as decoder
    from radixlm.models.linear.int4 import Int4GroupwiseLinear

    outs: dict[tuple, torch.Tensor] = {}

    def zeros(rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
        return outs.setdefault((rows, cols, dtype), torch.zeros(rows, cols, dtype=dtype))

    Int4GroupwiseLinear.small = lambda self, x: zeros(x.shape[0], self.out_features, x.dtype)
    decoder.parallel_logits = lambda h, method, vocab, ctx: zeros(h.shape[0], vocab, h.dtype)


def run(args: argparse.Namespace) -> list[float]:
    from radixlm.bench.offline import greedy_params
    from radixlm.engine import Engine
    from radixlm.models.loader import resolve_model_path

    b = args.batch_size
    engine = Engine(resolve_model_path(None), max_running_requests=b,
                    max_total_tokens=b * (args.steps + 40) + 256, disable_overlap_schedule=True)
    model = engine.scheduler.runner.model
    forward, cpu_ns, prof = model.forward, [], cProfile.Profile()
    profiling = [True]  # round 0: cProfile around each decode forward (counts only)

    def timed(fb):
        if not fb.forward_mode.is_decode():
            return forward(fb)
        if profiling[0]:
            prof.enable()
        t = time.thread_time_ns()
        out = forward(fb)
        cpu_ns.append(time.thread_time_ns() - t)
        prof.disable()
        return out

    model.forward = timed
    medians = []
    for i in range(args.rounds + 1):
        rids = [engine.submit(list(range(100 + 7 * r + i, 132 + 7 * r + i)),
                              greedy_params(args.steps + 1)) for r in range(b)]
        engine.step()
        cpu_ns.clear()
        while not all(engine.result(r)["finished"] for r in rids):
            engine.step()
        if i == 0:
            profiling[0] = False
            st = pstats.Stats(prof)
            getattrs = sum(v[1] for k, v in st.stats.items() if k[2] == "__getattr__"
                           and k[0].endswith("module.py"))
            print(f"python calls per forward {st.total_calls / len(cpu_ns):.0f}, "
                  f"nn.Module.__getattr__ per forward {getattrs / len(cpu_ns):.0f}")
        else:
            medians.append(statistics.median(cpu_ns) / 1e6)
        for r in rids:
            engine.pop_result(r)
    return medians


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stubbed", action="store_true",
                    help="int4 GEMMs and LM head stubbed (the overhead alone)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.stubbed:
        stub_gemms()
    medians = run(args)
    what = "stubbed GEMMs, " if args.stubbed else ""
    print(f"batch {args.batch_size}: {what}CPU ms per decode forward, median per round: "
          + ", ".join(f"{m:.2f}" for m in medians))


if __name__ == "__main__":
    main()
