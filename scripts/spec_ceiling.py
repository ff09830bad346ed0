"""How much lookup drafting can gain on a workload, from the greedy outputs themselves.

    python scripts/spec_ceiling.py [--model M] [--max-tokens 256] [--k 4]
                                   [--verify-cost 1:1.12,2:1.18,3:1.24,4:1.36,7:1.64]

Greedy outputs are the same with speculation on or off, so the steps a drafter saves
can be counted offline: generate `radixlm bench spec`'s copy-heavy prompts, its
repeat-chat turns (the first answer: text written anew) and its random prompts once
without speculation, then replay each output token by token against

    ngram k        the engine's NGRAM drafter (the class the server runs, default n-gram
                   sizes) under its per-request controller (adaptive.py), drafts up to k;
    ngram k always the same drafter at a fixed k, no controller (k=16: 16 drafts);
    ngram min=1    with 1-token suffixes looked up too;
    2 branches     the two latest distinct continuations of the longest matching suffix,
                   3 tokens each, verified in one step (what a draft tree would add);
    any lookup     an oracle: at each step the longest continuation of the output that
                   occurs anywhere in the prompt or the output so far, of any length
                   (what the best possible prompt-lookup drafter could propose).

A step yields accepted + 1 tokens. Steps are costed in decode steps: 1 for a step without
a draft, --verify-cost K:C for a verify of K drafts (measured by
`scripts/verify_step_cost.py`; the nearest K at or above is used; "free" costs every
verify 1, the ceiling with verification for nothing). The predicted speedup is tokens /
cost; `tokens copied` is the share of output tokens that arrive as accepted drafts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
from dataclasses import dataclass

from radixlm.bench.spec import (CHAT_QUESTIONS, COPY_PROMPTS, REPEAT_ASK, SpecBenchConfig,
                                random_words_prompt)
from radixlm.engine import Engine
from radixlm.speculative.adaptive import AdaptiveDraft
from radixlm.speculative.ngram import NgramDrafter


@dataclass
class _Req:
    """What NgramDrafter reads of a request."""
    rid: str
    fill_ids: list[int]


def longest_copy(out: list[int], t: int, history: list[int]) -> int:
    """The largest m with out[t:t + m] a contiguous run of `history`."""
    best = 0
    first = out[t] if t < len(out) else None
    for s, tok in enumerate(history):
        if tok != first:
            continue
        m = 0
        while t + m < len(out) and s + m < len(history) and history[s + m] == out[t + m]:
            m += 1
        best = max(best, m)
    return best


def replay(prompt: list[int], out: list[int], propose, k: int,
           adaptive: AdaptiveDraft | None = None) -> list[tuple[int, int]]:
    """(drafted, accepted) per step when `propose(tokens, t, budget)` drafts before each
    step within its budget (k, or the adaptive controller's). `propose` may return several
    candidate continuations (a list of lists: branches verified in one step, drafted =
    their total length, the longest accepted one taken)."""
    steps, t = [], 0
    while t < len(out):
        budget = adaptive.budget(len(steps) + 1) if adaptive is not None else k
        got = propose(prompt + out[:t], t, budget) if budget > 0 else []
        branches = got if got and isinstance(got[0], list) else [got]
        branches = [b[:budget] for b in branches if b]
        acc = 0
        for draft in branches:
            a = 0
            while a < len(draft) and t + a < len(out) - 1 and draft[a] == out[t + a]:
                a += 1
            acc = max(acc, a)
        drafted = sum(len(b) for b in branches)
        if drafted and adaptive is not None:
            adaptive.record(len(steps) + 1, drafted, acc)
        steps.append((drafted, acc))
        t += acc + 1
    return steps


def suffix_branches(tokens: list[int], k: int, n_branches: int, ngram_min: int = 2,
                    ngram_max: int = 5) -> list[list[int]]:
    """Up to n_branches distinct continuations (k tokens each) of the longest suffix of
    `tokens` (ngram_max down to ngram_min) found earlier in them, the latest first: the
    candidates a draft tree would verify together."""
    out: list[list[int]] = []
    n_tok = len(tokens)
    for n in range(min(ngram_max, n_tok - 1), ngram_min - 1, -1):
        suffix = tokens[n_tok - n:]
        for e in range(n_tok - 1, n - 1, -1):
            if tokens[e - n:e] == suffix and (c := tokens[e:e + k]) not in out:
                out.append(c)
                if len(out) == n_branches:
                    return out
        if out:
            return out
    return out


def cost(steps: list[tuple[int, int]], verify_cost: dict[int, float] | None) -> float:
    total = 0.0
    for drafted, _ in steps:
        if drafted == 0 or verify_cost is None:
            total += 1.0
            continue
        ks = sorted(k for k in verify_cost if k >= drafted) or [max(verify_cost)]
        total += verify_cost[ks[0]]
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--verify-cost", default="1:1.12,2:1.18,3:1.24,4:1.36,7:1.64",
                    help="K:C,... a verify of K drafts costs C decode steps")
    ap.add_argument("--outputs", default=None,
                    help="JSON file of the generated cases: read if it exists, else written")
    args = ap.parse_args()
    if args.outputs and os.path.exists(args.outputs):
        with open(args.outputs) as f:
            cases = json.load(f)
    else:
        cases = generate(args.model, args.max_tokens)
        if args.outputs:
            with open(args.outputs, "w") as f:
                json.dump(cases, f)
    vc = {int(a): float(b) for a, b in (x.split(":") for x in args.verify_cost.split(","))}
    report(cases, args.k, vc)


def generate(model: str | None, max_tokens: int) -> list[tuple[str, list[int], list[int]]]:
    """(name, prompt ids, greedy output ids) of each case, without speculation."""
    engine = Engine(model, disable_radix_cache=True)
    tok = engine.tokenizer
    params = {"max_new_tokens": max_tokens, "temperature": 0.0}

    def chat(messages: list[dict]) -> list[int]:
        return tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True,
                                                  tokenize=False), add_special_tokens=False)

    cases = []
    for i, p in enumerate(COPY_PROMPTS):
        ids = chat([{"role": "user", "content": p}])
        cases.append((f"copy-heavy {i}", ids, engine.generate(ids, params)["output_ids"]))
    for i, q in enumerate(CHAT_QUESTIONS):
        first = engine.generate(chat([{"role": "user", "content": q}]), params)
        msgs = [{"role": "user", "content": q},
                {"role": "assistant", "content": tok.decode(first["output_ids"],
                                                            skip_special_tokens=True)},
                {"role": "user", "content": REPEAT_ASK}]
        ids = chat(msgs)
        cases.append((f"repeat-chat {i}", ids, engine.generate(ids, params)["output_ids"]))
        # The first answer: text the model writes anew (what drafting must not slow down).
        cases.append((f"first-answer {i}", chat(msgs[:1]), first["output_ids"]))
    spec = SpecBenchConfig()  # bench spec's random workload at its defaults
    rng = random.Random(spec.seed)
    for i in range(spec.random_prompts):
        ids = chat([{"role": "user", "content": random_words_prompt(rng)}])
        cases.append((f"random {i}", ids, engine.generate(ids, params)["output_ids"]))
    engine.shutdown()
    return cases


def report(cases: list, k: int, vc: dict[int, float]) -> None:
    def ngram(ngram_min: int = 2):
        drafter = NgramDrafter(ngram_min=ngram_min)

        def propose(tokens: list[int], t: int, budget: int) -> list[int]:
            return drafter.propose([_Req("r", tokens)], [budget])[0].tokens
        return propose

    def oracle(out: list[int]):
        def propose(tokens: list[int], t: int, budget: int) -> list[int]:
            return out[t:t + longest_copy(out, t, tokens)]
        return propose

    policies = {  # label: (propose factory, k, adaptive controller factory or None)
        f"ngram k={k}": (lambda out: ngram(), k, lambda: AdaptiveDraft(k)),
        f"ngram k={k} always": (lambda out: ngram(), k, None),
        "ngram k=16 always": (lambda out: ngram(), 16, None),
        f"ngram min=1 k={k}": (lambda out: ngram(1), k, lambda: AdaptiveDraft(k)),
        "2 branches k=3": (lambda out: lambda tokens, t, b: suffix_branches(tokens, 3, 2),
                           3, None),
        "any lookup": (oracle, 10**6, None),
    }

    print(f"costs (decode steps per verify of K drafts): {vc}")
    print(f"{'case':<14}{'out':>5}  {'drafter':<20}{'steps':>6}{'drafted':>8}{'copied':>8}"
          f"{'speedup':>9}{'free':>7}")
    totals: dict[tuple[str, str], list[float]] = {}
    for name, prompt, out in cases:
        for label, (make, kk, ad) in policies.items():
            steps = replay(prompt, out, make(out), kk, ad() if ad else None)
            copied = sum(a for _, a in steps)
            drafted = sum(1 for d, _ in steps if d)
            paid, free = cost(steps, vc), cost(steps, None)
            print(f"{name:<14}{len(out):>5}  {label:<20}{len(steps):>6}{drafted:>8}"
                  f"{copied / len(out):>8.0%}{len(out) / paid:>8.2f}x{len(out) / free:>6.2f}x")
            tot = totals.setdefault((name.rsplit(" ", 1)[0], label), [0, 0, 0, 0])
            for i, v in enumerate((len(out), copied, paid, free)):
                tot[i] += v
    print("whole workloads (as `radixlm bench spec` times them: tokens / cost over its cases)")
    for (work, label), (n, copied, c, free) in totals.items():
        print(f"{work:<14}{n:>5}  {label:<20}{'':>14}{copied / n:>8.0%}{n / c:>8.2f}x"
              f"{n / free:>6.2f}x")


if __name__ == "__main__":
    main()
