"""Extend steps over cached prefixes: B requests, each first run with P random tokens (its
prefix enters the radix cache), then resubmitted with E more tokens, all B in one extend
step; prints that step's time per round (the prefill of a later chat turn):

    PYTHONPATH=$PWD python scripts/bench_prefix_extend.py B P E ROUNDS
"""

from __future__ import annotations

import statistics
import sys
import time

from radixlm.bench.offline import greedy_params, prompt_vocab
from radixlm.bench.workload import RandomWorkload, random_prompts
from radixlm.engine import Engine
from radixlm.models.loader import resolve_model_path


def main() -> None:
    b, p, e, rounds = (int(v) for v in sys.argv[1:5])
    engine = Engine(resolve_model_path(None), max_running_requests=b,
                    max_total_tokens=4 * b * (p + e + 8) + 256, max_prefill_tokens=b * (p + e),
                    chunked_prefill_size=b * (p + e), disable_overlap_schedule=True)
    vocab, excluded = prompt_vocab(engine)
    times = []
    for i in range(rounds):
        base = random_prompts(RandomWorkload(b, p, p, 1, 50 + i), vocab, excluded)
        engine.generate(base, greedy_params(1))  # cache the prefixes
        more = random_prompts(RandomWorkload(b, e, e, 1, 900 + i), vocab, excluded)
        rids = [engine.submit(x + y, greedy_params(1)) for x, y in zip(base, more)]
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
        while not all(engine.result(r)["finished"] for r in rids):
            engine.step()
        for r in rids:
            engine.pop_result(r)
    print("extend ms", [f"{t * 1e3:.1f}" for t in times],
          f"median {statistics.median(times) * 1e3:.1f}")


if __name__ == "__main__":
    main()
