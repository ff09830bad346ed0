"""Single-stream greedy generation with and without speculation, variants interleaved in
one process (one engine), so that load on the machine hits every variant alike.

    python scripts/spec_generate_ab.py [--dtype auto] [--max-tokens 64] [--rounds 3]
                                       [--num-threads 1] [--algorithm NGRAM]

One Engine with --speculative-algorithm (default NGRAM); per round, each of the copy-heavy
prompts of `radixlm bench spec` is generated once per variant:

    off            speculation off (the scheduler's speculative hook detached);
    extend         verify rows through the extend path, no row cap (before issue 27's
                   TARGET_VERIFY work);
    kernel         verify rows through the C++ decode kernel, no row cap;
    kernel+cap     the kernel and the row cap (speculative/verify_rows.py): the default.

The variants' order rotates every round. Prints per variant the median over rounds of the summed tokens/s and the ratio to off,
the mean acceptance length and whether the outputs equal those of "off". The radix cache
holds the prompts after the first generation (every variant reuses them alike).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from radixlm import SamplingParams
from radixlm.bench.spec import COPY_PROMPTS
from radixlm.engine import Engine
from radixlm.speculative.stats import SpecStats

VARIANTS = ("off", "extend", "kernel", "kernel+cap")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--num-threads", type=int, default=None)
    ap.add_argument("--algorithm", default="NGRAM")
    args = ap.parse_args()
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    eng = Engine(args.model, dtype=args.dtype, disable_overlap_schedule=True,
                 speculative_algorithm=args.algorithm)
    sched = eng.scheduler
    spec, backend = sched.speculative, sched.runner.attn_backend
    cap = spec.row_cap
    tok = eng.tokenizer
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}],
                                                  tokenize=False, add_generation_prompt=True),
                          add_special_tokens=False) for p in COPY_PROMPTS]
    params = SamplingParams(max_new_tokens=args.max_tokens, temperature=0.0)
    eng.generate(prompts[0], SamplingParams(max_new_tokens=4, temperature=0.0))  # warm up
    rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    outputs: dict[str, list] = {}
    accept: dict[str, SpecStats] = {}
    for rnd in range(args.rounds):
        # The order rotates each round, so that a load trend favours no variant.
        for v in VARIANTS[rnd % 4:] + VARIANTS[:rnd % 4]:
            sched.speculative = None if v == "off" else spec
            spec.row_cap = cap if v == "kernel+cap" else None
            backend.verify_kernel = v != "extend"
            spec.stats = accept.setdefault(v, SpecStats(spec.drafter.name, spec.k))
            tokens, t0 = 0, time.perf_counter()
            outs = []
            for p in prompts:
                out = eng.generate(p, params)["output_ids"]
                outs.append(out)
                tokens += len(out)
            rates[v].append(tokens / (time.perf_counter() - t0))
            outputs.setdefault(v, outs)
    sched.speculative, spec.row_cap, backend.verify_kernel = spec, cap, True
    off = statistics.median(rates["off"])
    print(f"dtype {sched.runner.dtype}, threads {torch.get_num_threads()}, {args.algorithm} "
          f"k={spec.k}, row cap {cap}, {args.rounds} rounds x {len(prompts)} prompts x "
          f"{args.max_tokens} tokens")
    print(f"{'variant':<12}{'tok/s':>8}{'x off':>8}{'accept len':>12}  same output as off")
    for v in VARIANTS:
        r = statistics.median(rates[v])
        acc = accept[v].mean_acceptance_length if v != "off" else float("nan")
        print(f"{v:<12}{r:>8.2f}{r / off:>8.2f}{acc:>12.2f}  {outputs[v] == outputs['off']}")


if __name__ == "__main__":
    main()
