"""The sampler's CPU kernel (cpu_kernels/sampling.cpp) against the torch code it replaces
(executor/sampler.py): the same argmax, the same inverse-CDF draw up to float rounding at
a token's boundary, masked tokens never drawn, invalid rows reported, and every row's
result independent of the batch around it and of the thread count. The argmax, draw and
cut tests also run the kernel as an AVX2-only CPU builds it (8-float vectors)."""

from __future__ import annotations

import pytest
import torch

import radixlm.executor.sampler as sampler_mod
from radixlm.cpu_kernels.build import load_kernel
from radixlm.executor.sampler import Sampler, SamplingBatchInfo, draw_rows
from radixlm.sampling_params import SamplingParams
from radixlm.scheduler.output_processor import OutputProcessor
from radixlm.scheduler.req import Req

pytestmark = pytest.mark.skipif(load_kernel("sampling") is None,
                                reason="the C++ CPU kernels did not build (needs g++ and ninja)")

# Vocabularies: SmolLM2's and Gemma 3's, and sizes that end inside a chunk or a vector.
VOCABS = [49152, 262144, 2049, 17]


def kernel():
    return load_kernel("sampling")


@pytest.fixture(params=["native", "8 lanes"])
def module(request):
    """The kernel as built here, and as an AVX2-only CPU builds it (8-float vectors)."""
    if request.param == "native":
        return kernel()
    from tests.kernel_variants import variant

    return variant("sampling", 8)


def draw(logits, rows, inv_t, u, top_k=None, top_p=1.0, min_p=0.0, module=None):
    """The kernel's draw, with one top_k / top_p / min_p for every row (no cut by default)."""
    n = len(rows)
    ks = torch.full((n,), top_k or logits.shape[1], dtype=torch.int64)
    return (module or kernel()).sample_rows(logits, rows, inv_t, u, ks,
                                            torch.full((n,), float(top_p)),
                                            torch.full((n,), float(min_p)))


@pytest.mark.parametrize("vocab", VOCABS)
def test_argmax_equals_torch(vocab: int, module) -> None:
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(5, vocab, generator=g) * 4
    logits[1, vocab // 3] = logits[1, vocab - 1] = 100.0  # a tie: the first index wins
    logits[2] = float("-inf")  # nothing finite: index 0, as torch
    logits[3, vocab // 2] = float("nan")  # a NaN is torch's max
    logits[4, :] = 0.0
    assert module.argmax_rows(logits).tolist() == torch.argmax(logits, dim=-1).tolist()


def _reference_bounds(logits: torch.Tensor, inv_t: float, token: int) -> tuple[float, float]:
    """[cdf before token, cdf through token] / total in float64 from torch's softmax."""
    cdf = torch.softmax(logits * inv_t, dim=-1).double().cumsum(-1)
    total = float(cdf[-1])
    lo = float(cdf[token - 1]) if token > 0 else 0.0
    return lo / total, float(cdf[token]) / total


@pytest.mark.parametrize("vocab", VOCABS)
def test_draw_is_the_inverse_cdf_of_the_softmax(vocab: int, module) -> None:
    """Each drawn token's cumulative-probability interval holds u (to float32 rounding of
    the probabilities), and the draw equals the torch path's wherever u is not within
    rounding of a boundary."""
    g = torch.Generator().manual_seed(7 + vocab)
    logits = torch.randn(16, vocab, generator=g) * 3
    rows = torch.arange(16)
    inv_t = torch.rand(16, generator=g) * 2 + 0.3
    u = torch.rand(16, dtype=torch.float64, generator=g)
    u[0], u[1] = 0.0, 1.0 - 2 ** -53  # both ends
    tokens, valid = draw(logits, rows, inv_t, u, module=module)
    assert valid.all()
    ref, _ = draw_rows(torch.softmax(logits * inv_t[:, None], dim=-1), u)
    for s in range(16):
        lo, hi = _reference_bounds(logits[s], float(inv_t[s]), int(tokens[s]))
        assert lo - 1e-5 <= float(u[s]) <= hi + 1e-5, (s, lo, float(u[s]), hi)
        if min(abs(float(u[s]) - lo), abs(hi - float(u[s]))) > 1e-5:
            assert int(tokens[s]) == int(ref[s])


def test_masked_tokens_are_never_drawn() -> None:
    """-inf logits (a grammar's mask) have weight exactly 0, at either end of the row and
    across chunk boundaries: u = 0 draws the first allowed token, u -> 1 the last."""
    vocab = 10000
    logits = torch.full((3, vocab), float("-inf"))
    allowed = [3000, 4095, 4096, 9999]
    logits[:, allowed] = torch.tensor([1.0, -2.0, 0.5, 3.0])
    u = torch.tensor([0.0, 1.0 - 2 ** -53, 0.5], dtype=torch.float64)
    tokens, valid = draw(logits, torch.arange(3), torch.ones(3), u)
    assert valid.all()
    assert tokens[0] == 3000 and tokens[1] == 9999 and int(tokens[2]) in allowed


@pytest.mark.parametrize("bad", ["nan", "inf", "all_masked", "zero_temperature"])
def test_a_row_without_a_distribution_is_invalid(bad: str) -> None:
    logits = torch.randn(2, 3000)
    inv_t = torch.ones(2)
    if bad == "nan":
        logits[0, 2500] = float("nan")
    elif bad == "inf":
        logits[0, 10] = float("inf")
    elif bad == "all_masked":
        logits[0] = float("-inf")
    else:
        inv_t[0] = float("inf")
    _, valid = draw(logits, torch.arange(2), inv_t, torch.full((2,), 0.5, dtype=torch.float64))
    assert valid.tolist() == [False, True]


def test_a_row_draws_the_same_token_in_any_batch_and_thread_count() -> None:
    """Batch invariance (deterministic inference relies on it): row 0's token alone, in a
    batch of 32 and with one or two threads, for many draws."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(32, 49152, generator=g) * 2
    u = torch.rand(32, dtype=torch.float64, generator=g)
    inv_t = torch.full((32,), 1.0 / 0.7)
    threads = torch.get_num_threads()
    try:
        results = []
        for n_threads in (1, 2):
            torch.set_num_threads(n_threads)
            alone = [int(draw(logits, torch.tensor([s]), inv_t[s:s + 1], u[s:s + 1],
                              top_p=0.9)[0]) for s in range(32)]
            batch = draw(logits, torch.arange(32), inv_t, u, top_p=0.9)[0].tolist()
            assert alone == batch
            results.append(batch)
        assert results[0] == results[1]
    finally:
        torch.set_num_threads(threads)


CUTS = [dict(top_k=40), dict(top_p=0.9), dict(top_p=0.5, top_k=3), dict(min_p=0.05),
        dict(top_p=0.95, min_p=0.02), dict(top_k=2)]


@pytest.mark.parametrize("vocab,scale", [(49152, 4.0), (49152, 0.5), (2049, 4.0)])
@pytest.mark.parametrize("cut", CUTS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_cuts_equal_the_torch_cut(vocab: int, scale: float, cut: dict, module) -> None:
    """top-k / top-p / min-p: each draw equals the torch path's (softmax, Sampler._cut
    without renormalization, inverse CDF) for the same u, wherever u is not within float
    rounding of a boundary; never a token the torch cut removed. Scale 0.5 is a flat
    distribution: a top-p nucleus of most of the vocabulary."""
    g = torch.Generator().manual_seed(vocab + len(cut))
    n = 64 if scale > 1 else 8
    logits = torch.randn(n, vocab, generator=g) * scale
    inv_t = torch.full((n,), 1.0 / 0.8)
    u = torch.rand(n, dtype=torch.float64, generator=g)
    tokens, valid = draw(logits, torch.arange(n), inv_t, u, **cut, module=module)
    assert valid.all()
    params = [SamplingParams(temperature=0.8, **cut) for _ in range(n)]
    info = SamplingBatchInfo.from_reqs([_Row(p) for p in params], vocab, torch.device("cpu"))
    probs = Sampler._cut(torch.softmax(logits * inv_t[:, None], dim=-1), info, torch.arange(n),
                         normalize=False)
    ref, _ = draw_rows(probs, u)
    assert bool((probs.gather(1, tokens[:, None]) > 0).all())
    cdf = probs.double().cumsum(-1)
    cdf = cdf / cdf[:, -1:]
    for s in range(n):
        t = int(tokens[s])
        lo = float(cdf[s, t - 1]) if t > 0 else 0.0
        if min(abs(float(u[s]) - lo), abs(float(cdf[s, t]) - float(u[s]))) > 1e-4:
            assert t == int(ref[s]), (s, t, int(ref[s]))


def test_ties_at_the_top_k_boundary_keep_the_lowest_indices() -> None:
    """Equal weights: top_k=5 keeps tokens 0..4 (weight descending, index ascending),
    whatever u draws."""
    logits = torch.zeros(8, 3000)
    u = torch.linspace(0, 1 - 2 ** -53, 8, dtype=torch.float64)
    tokens, valid = draw(logits, torch.arange(8), torch.ones(8), u, top_k=5)
    assert valid.all() and tokens.tolist() == [0, 0, 1, 2, 2, 3, 4, 4]


def test_ties_at_the_top_p_boundary_keep_the_lowest_indices() -> None:
    """Equal weights, top_p 0.5: the first half of the vocabulary stays (the mass before
    token 1500 reaches half), the last draw is its last token."""
    logits = torch.zeros(4, 3000)
    u = torch.tensor([0.0, 0.25, 0.5, 1 - 2 ** -53], dtype=torch.float64)
    tokens, valid = draw(logits, torch.arange(4), torch.ones(4), u, top_p=0.5)
    assert valid.all() and tokens.tolist() == [0, 375, 750, 1499]


def test_top_p_draws_the_renormalized_nucleus() -> None:
    """4000 draws over a small vocabulary with top_p 0.8: the counts match the nucleus'
    renormalized probabilities (chi-square, 0.1% quantile), nothing outside it."""
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0] + [-30.0] * 42)
    probs = torch.softmax(logits, dim=-1)
    nucleus = int((probs.cumsum(0) - probs < 0.8).sum())
    n = 4000
    u = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(11))
    tokens, _ = draw(logits.expand(n, -1).contiguous(), torch.arange(n), torch.ones(n), u,
                     top_p=0.8)
    counts = torch.bincount(tokens, minlength=50).float()
    assert counts[nucleus:].sum() == 0
    expected = probs[:nucleus] / probs[:nucleus].sum() * n
    chi2 = float(((counts[:nucleus] - expected) ** 2 / expected).sum())
    # The 0.1% quantile of chi-square with nucleus - 1 degrees of freedom (3 here).
    assert nucleus == 4 and chi2 < 16.27, (chi2, counts[:nucleus].tolist(), expected.tolist())


class _Row:
    """What SamplingBatchInfo.from_reqs reads of a request."""

    def __init__(self, params: SamplingParams) -> None:
        self.sampling_params = params
        self.generator = torch.Generator().manual_seed(0)
        self.output_counts = self.seen_mask = None
        self.seq_len = 1
        self.uses_penalties = False


def _req(i: int, **kw) -> Req:
    req = Req(rid=str(i), input_ids=[1, 2, 3], sampling_params=SamplingParams(**kw))
    if not req.sampling_params.is_greedy:
        req.generator = torch.Generator().manual_seed(100 + i)
    OutputProcessor(None, 100, 3000, torch.device("cpu")).init_penalty_state(req)
    return req


def test_sampler_takes_the_same_tokens_with_and_without_the_kernel(monkeypatch) -> None:
    """Greedy and temperature rows of one batch, through Sampler with the kernel and with
    its torch code (the same seeds): the same tokens (random logits: no u near a boundary
    at this size)."""
    vocab = 3000
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(5)) * 3

    def run() -> list[int]:
        reqs = [_req(0, temperature=0.0), _req(1, temperature=0.7), _req(2, temperature=1.0),
                _req(3, temperature=0.0), _req(4, temperature=1.3), _req(5, temperature=1.0)]
        info = SamplingBatchInfo.from_reqs(reqs, vocab, torch.device("cpu"))
        return Sampler()(logits.clone(), info).next_token_ids.tolist()

    with_kernel = run()
    monkeypatch.setattr(sampler_mod, "sampling_kernel", lambda: None)
    assert run() == with_kernel
