"""Single-stream decode speed while the compiled decode graphs are made in the background
(--enable-torch-compile, executor/decode_graph_runner.py), against eager alone and
against the graphs once made: how much a background compile costs the requests it runs
beside, and how long it takes.

    python scripts/bench_compile_background.py [--model GGUF] [--max-bs 4] [--tokens 32]

Engine A (eager) answers `--rounds` requests alone; then engine B starts with
--enable-torch-compile and answers one request after another until its graphs are all
made (each line: time since B started, sizes ready, tok/s), then `--rounds` more. Run it
twice for a warm inductor cache (TORCHINDUCTOR_CACHE_DIR, default
~/.cache/radixlm/inductor); point that at an empty folder for a cold one.
"""

from __future__ import annotations

import argparse
import statistics
import time

from radixlm import SamplingParams
from radixlm.bench.report import machine_info
from radixlm.engine import Engine

PROMPT = "Tell me a story about a cat who lived in a lighthouse."


def tok_s(engine: Engine, params: SamplingParams) -> float:
    t = time.perf_counter()
    out = engine.generate(PROMPT, params)
    return len(out["output_ids"]) / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--max-bs", type=int, default=4, help="--torch-compile-max-bs")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ns = ap.parse_args()
    print(machine_info())
    params = SamplingParams(max_new_tokens=ns.tokens, temperature=0, ignore_eos=True)
    eager = Engine(ns.model)
    eager_tok_s = statistics.median(tok_s(eager, params) for _ in range(ns.rounds))
    del eager
    t0 = time.perf_counter()
    engine = Engine(ns.model, enable_torch_compile=True, torch_compile_max_bs=ns.max_bs)
    start_s = time.perf_counter() - t0
    graphs = engine.scheduler.runner.decode_graphs
    during: list[float] = []
    while graphs.capturing:
        during.append(tok_s(engine, params))
        print(f"{time.perf_counter() - t0:7.1f} s  ready {graphs.ready_sizes}  "
              f"{during[-1]:6.1f} tok/s", flush=True)
    ready_s = time.perf_counter() - t0
    assert graphs.wait_ready(), graphs.error
    after = statistics.median(tok_s(engine, params) for _ in range(ns.rounds))
    print(f"engine B ready to serve after {start_s:.1f} s; graphs {graphs.batch_sizes} made "
          f"after {ready_s:.1f} s ({graphs.capture_s:.1f} s of capture)")
    print(f"single stream, {ns.tokens} tokens: eager alone {eager_tok_s:.1f} tok/s; while "
          f"compiling median {statistics.median(during) if during else float('nan'):.1f} "
          f"({len(during)} requests); compiled after {after:.1f} "
          f"({after / eager_tok_s:.2f}x eager)")


if __name__ == "__main__":
    main()
