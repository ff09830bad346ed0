"""Speculative sampling keeps the target's distribution (tiny random Llama, top-k 4).

A drafter proposes, after the first sampled token t0, the target's two greedy tokens (so
drafts are accepted about half the time and rejected otherwise). Over N seeded requests the
empirical law of the first three tokens (t0, t1, t2) is compared with the exact one computed
from the HF model (top-4 renormalized at temperature 1) by a chi-square test (cells with
expected count < 5 merged); the statistic must stay under the 0.1% critical value. The
verify steps must have both accepted and rejected drafts, or the test proves nothing.
"""

from __future__ import annotations

import math

import pytest
import torch

from radixlm import SamplingParams
from radixlm.engine import Engine
from radixlm.speculative.drafter import Draft
from tests.engine_checks import assert_all_slots_back

N = 3000
TOP_K = 4
PROMPT = [1, 17, 42, 99, 5]


def _top_k_probs(logits: torch.Tensor) -> dict[int, float]:
    vals, ids = logits.float().topk(TOP_K)
    p = torch.softmax(vals, -1)
    return dict(zip(ids.tolist(), p.tolist()))


def _exact(model_dir: str) -> tuple[dict[tuple[int, ...], float], dict[tuple[int, ...], list[int]]]:
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()

    @torch.no_grad()
    def next_logits(ids: list[int]) -> torch.Tensor:
        return model(torch.tensor([ids])).logits[0, -1]

    law: dict[tuple[int, ...], float] = {}
    drafts: dict[tuple[int, ...], list[int]] = {}
    for t0, p0 in _top_k_probs(next_logits(PROMPT)).items():
        l1 = next_logits(PROMPT + [t0])
        g1 = int(l1.argmax())
        drafts[(t0,)] = [g1, int(next_logits(PROMPT + [t0, g1]).argmax())]
        for t1, p1 in _top_k_probs(l1).items():
            for t2, p2 in _top_k_probs(next_logits(PROMPT + [t0, t1])).items():
                law[(t0, t1, t2)] = p0 * p1 * p2
    return law, drafts


class TableDrafter:
    """Drafts the target's greedy pair right after the first output token, nothing else."""
    name = "TABLE"
    costly = False
    tracked: frozenset[str] = frozenset()

    def __init__(self, table: dict[tuple[int, ...], list[int]]) -> None:
        self.table = table

    def propose(self, reqs, max_tokens):
        return [Draft(self.table.get(tuple(r.output_ids), [])[:k]) for r, k in zip(reqs, max_tokens)]

    def forget(self, rid: str) -> None:
        pass


def chi_square(law: dict, counts: dict, n: int) -> tuple[float, int]:
    """Pearson's statistic of `counts` (n draws) against `law`, and its degrees of
    freedom; cells expected fewer than 5 times are pooled into one."""
    stat, dof, pooled_e, pooled_o = 0.0, -1, 0.0, 0
    for key, p in law.items():
        e, o = n * p, counts.get(key, 0)
        if e < 5:
            pooled_e, pooled_o = pooled_e + e, pooled_o + o
            continue
        stat += (o - e) ** 2 / e
        dof += 1
    if pooled_e > 0:
        stat += (pooled_o - pooled_e) ** 2 / pooled_e
        dof += 1
    return stat, dof


def chi2_critical(dof: int, z: float = 3.09) -> float:
    """Wilson-Hilferty: the chi-square quantile at the normal quantile z (3.09: 0.1%)."""
    a = 2.0 / (9.0 * dof)
    return dof * (1.0 - a + z * math.sqrt(a)) ** 3


@pytest.mark.slow
def test_rejection_sampling_keeps_the_target_distribution(tiny_llama_dir):
    law, table = _exact(tiny_llama_dir)
    eng = Engine(model=tiny_llama_dir, dtype="float32", device="cpu", max_total_tokens=8192,
                 max_running_requests=64, speculative_algorithm="NGRAM",
                 speculative_disable_by_batch_size=64, speculative_num_draft_tokens=2)
    spec = eng.scheduler.speculative
    spec.drafter = TableDrafter(table)
    counts: dict[tuple[int, ...], int] = {}
    for start in range(0, N, 64):
        params = [SamplingParams(max_new_tokens=4, temperature=1.0, top_k=TOP_K, seed=s,
                                 ignore_eos=True) for s in range(start, min(N, start + 64))]
        for o in eng.generate([PROMPT] * len(params), params):
            key = tuple(o["output_ids"][:3])
            counts[key] = counts.get(key, 0) + 1
    assert_all_slots_back(eng)
    assert set(counts) <= set(law), set(counts) - set(law)
    stat, dof = chi_square(law, counts, N)
    assert stat < chi2_critical(dof), (stat, dof, chi2_critical(dof))
    hist = spec.stats.accept_hist  # both paths ran: accepted drafts and the residual
    assert hist[0] > N // 20 and sum(hist[1:]) > N // 20, spec.stats.as_dict()
