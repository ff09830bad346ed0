"""How far a prompt's logits move when it is prefilled in two chunks instead of one, per
linear policy: the default model in float32, a random 60-token prompt prefilled whole and
as 44 + 16 tokens (the second chunk over the first's KV, as chunked prefill and a prefix
cache hit run it); the largest |difference| of the logits of the same positions, the
largest |logit|, and the share of positions whose argmax agrees.

    PYTHONPATH=$PWD python scripts/chunked_prefill_drift.py

With x unquantized the two differ by float rounding (~1e-5); with
`--int4-int8-activations` each int4 layer rounds x to int8 per group of 32, so a rounding
difference upstream (the attention of 60 vs 44 rows) flips some of those roundings and
the logits move by a few percent of the largest: why that flag stays opt-in
(docs/benchmarks.md, "int8 activations by default in float32 runs: tried, not landed").
"""

from __future__ import annotations

import argparse

import torch

from radixlm.bench.report import machine_info
from radixlm.models.linear import LinearPolicy
from radixlm.models.loader import load_model, resolve_model_path
from tests.conftest_models import PoolHarness


def drift(policy: LinearPolicy, ids: list[int], split: int) -> dict[str, float]:
    model, config = load_model(resolve_model_path(None), torch.float32, "cpu",
                               linear_policy=policy)
    h = PoolHarness(model, config)
    whole = h.extend([h.new_request()], [ids], all_logits=True)
    h = PoolHarness(model, config)
    row = h.new_request()
    first = h.extend([row], [ids[:split]], all_logits=True)
    second = h.extend([row], [ids[split:]], all_logits=True)
    chunked = torch.cat([first, second])
    return {"max_abs_diff": (whole - chunked).abs().max().item(),
            "max_abs_logit": whole.abs().max().item(),
            "argmax_agree": (whole.argmax(-1) == chunked.argmax(-1)).float().mean().item()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=60)
    ap.add_argument("--split", type=int, default=44)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    ids = torch.randint(100, 40000, (args.tokens,)).tolist()
    print(machine_info())
    for q8 in (False, True):
        result = drift(LinearPolicy("auto", int4_int8_activations=q8), ids, args.split)
        print(f"int4_int8_activations={q8}: " + ", ".join(f"{k} {v:.3g}" for k, v in
                                                           result.items()))


if __name__ == "__main__":
    main()
