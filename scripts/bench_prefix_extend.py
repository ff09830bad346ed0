"""Extend steps over cached prefixes: B requests, each first run with P random tokens (its
prefix enters the radix cache), then resubmitted with E more tokens, all B in one extend
step; prints that step's time per round (the prefill of a later chat turn):

    PYTHONPATH=$PWD python scripts/bench_prefix_extend.py B P E ROUNDS
"""
import os, statistics, sys, time
from radixlm.engine import Engine
from radixlm.bench.offline import greedy_params, prompt_vocab
from radixlm.bench.workload import RandomWorkload, random_prompts
from radixlm.models.loader import resolve_model_path
B, P, E, R = (int(x) for x in sys.argv[1:5])
eng = Engine(resolve_model_path(None), max_running_requests=B, max_total_tokens=4 * B * (P + E + 8) + 256,
             max_prefill_tokens=B * (P + E), chunked_prefill_size=B * (P + E), disable_overlap_schedule=True)
vocab, excl = prompt_vocab(eng)
ts = []
for i in range(R):
    base = random_prompts(RandomWorkload(B, P, P, 1, 50 + i), vocab, excl)
    eng.generate(base, greedy_params(1))  # cache the prefixes
    more = random_prompts(RandomWorkload(B, E, E, 1, 900 + i), vocab, excl)
    rids = [eng.submit(b + m, greedy_params(1)) for b, m in zip(base, more)]
    t0 = time.perf_counter(); eng.step(); ts.append(time.perf_counter() - t0)
    while not all(eng.result(r)["finished"] for r in rids):
        eng.step()
    for r in rids: eng.pop_result(r)
print("extend ms", ["%.1f" % (t * 1e3) for t in ts], "median %.1f" % (statistics.median(ts) * 1e3))
