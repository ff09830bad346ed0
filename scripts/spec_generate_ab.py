"""Single-stream greedy generation with and without speculation, variants interleaved in
one process (one engine), so that load on the machine hits every variant alike.

    python scripts/spec_generate_ab.py [--dtype auto] [--max-tokens 64] [--rounds 3]
                                       [--num-threads 1] [--algorithm NGRAM]
                                       [--workload copy|random] [--variants off,fixed,adaptive]

One Engine with --speculative-algorithm (default NGRAM); per round, each prompt of the
workload (copy: the copy-heavy prompts of `radixlm bench spec`; random: three of its random
word-list prompts) is generated once per variant:

    off            speculation off (the scheduler's speculative hook detached);
    extend         verify rows through the extend path, no row cap, fixed k (before issue
                   27's TARGET_VERIFY work);
    kernel         verify rows through the C++ decode kernel, no row cap, fixed k;
    kernel+cap     the kernel and the row cap (speculative/verify_rows.py), fixed k;
    fixed          the same as kernel+cap;
    adaptive       kernel, cap and per-request adaptive drafting (adaptive.py): the default.

The variants' order rotates every round. Prints per variant the median over rounds of the
summed tokens/s and the ratio to off, the tokens per verify step, the mean acceptance length,
verify steps per round and whether the outputs equal those of "off". The radix cache
holds the prompts after the first generation (every variant reuses them alike).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from radixlm import SamplingParams
from radixlm.bench.spec import COPY_PROMPTS, random_words_prompt
from radixlm.engine import Engine
from radixlm.speculative.stats import SpecStats

ALL_VARIANTS = ("off", "extend", "kernel", "kernel+cap", "fixed", "adaptive")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--num-threads", type=int, default=None)
    ap.add_argument("--algorithm", default="NGRAM")
    ap.add_argument("--workload", choices=("copy", "random"), default="copy")
    ap.add_argument("--variants", default="off,extend,kernel,kernel+cap,adaptive")
    args = ap.parse_args()
    variants = tuple(args.variants.split(","))
    if "off" not in variants or not set(variants) <= set(ALL_VARIANTS):
        raise SystemExit(f"--variants: off and any of {ALL_VARIANTS}")
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
                          add_special_tokens=False)
               for p in (COPY_PROMPTS if args.workload == "copy" else
                         [random_words_prompt(random.Random(i)) for i in range(3)])]
    params = SamplingParams(max_new_tokens=args.max_tokens, temperature=0.0)
    eng.generate(prompts[0], SamplingParams(max_new_tokens=4, temperature=0.0))  # warm up
    rates: dict[str, list[float]] = {v: [] for v in variants}
    outputs: dict[str, list] = {}
    accept: dict[str, SpecStats] = {}
    for rnd in range(args.rounds):
        # The order rotates each round, so that a load trend favours no variant.
        r = rnd % len(variants)
        for v in variants[r:] + variants[:r]:
            sched.speculative = None if v == "off" else spec
            spec.row_cap = cap if v in ("kernel+cap", "fixed", "adaptive") else None
            spec.adaptive = v == "adaptive"
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
    spec.adaptive = True
    off = statistics.median(rates["off"])
    print(f"dtype {sched.runner.dtype}, threads {torch.get_num_threads()}, {args.algorithm} "
          f"k={spec.k}, row cap {cap}, {args.rounds} rounds x {len(prompts)} prompts x "
          f"{args.max_tokens} tokens, {args.workload} prompts")
    print(f"{'variant':<12}{'tok/s':>8}{'x off':>8}{'tok/verify':>12}{'accept len':>12}"
          f"{'verifies/round':>16}  same output as off")
    for v in variants:
        r = statistics.median(rates[v])
        st = accept.get(v)
        acc = st.mean_acceptance_length if st and st.verifies else float("nan")
        per = (st.verifies + st.accepted) / st.verify_steps if st and st.verify_steps else float("nan")
        steps = st.verify_steps / args.rounds if st else float("nan")
        print(f"{v:<12}{r:>8.2f}{r / off:>8.2f}{per:>12.2f}{acc:>12.2f}{steps:>16.1f}  "
              f"{outputs[v] == outputs['off']}")


if __name__ == "__main__":
    main()
