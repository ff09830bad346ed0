import torch

from radixlm.executor.sampler import Sampler, SamplingBatchInfo
from radixlm.sampling_params import SamplingParams
from radixlm.scheduler.output_processor import OutputProcessor
from radixlm.scheduler.req import Req

V = 50


def make_req(i: int, gen_seed: int | None = None, **kw) -> Req:
    req = Req(rid=str(i), input_ids=[1, 2, 3], sampling_params=SamplingParams(**kw))
    if not req.sampling_params.is_greedy:
        req.generator = torch.Generator().manual_seed(gen_seed if gen_seed is not None else i)
    OutputProcessor(None, 100, V, torch.device("cpu")).init_penalty_state(req)
    return req


def sample(reqs, logits):
    info = SamplingBatchInfo.from_reqs(reqs, V, torch.device("cpu"))
    return Sampler()(logits, info)


def test_greedy_and_top_k_1_are_argmax():
    logits = torch.randn(3, V)
    reqs = [make_req(0, temperature=0.0), make_req(1, temperature=0.9, top_k=1), make_req(2, temperature=0.0)]
    out = sample(reqs, logits)
    assert out.next_token_ids.tolist() == logits.argmax(-1).tolist()


def test_seeded_sampling_reproduces_regardless_of_batch_neighbours():
    torch.manual_seed(0)
    logits = torch.randn(4, V)
    alone = sample([make_req(0, gen_seed=7, temperature=1.0)], logits[:1]).next_token_ids.tolist()
    batch = [make_req(9, temperature=0.0), make_req(0, gen_seed=7, temperature=1.0),
             make_req(3, gen_seed=1, temperature=0.7, top_p=0.5)]
    together = sample(batch, torch.stack([logits[2], logits[0], logits[3]])).next_token_ids.tolist()
    assert together[1] == alone[0]


def _seen(logits: torch.Tensor, **kw) -> set[int]:
    return {sample([make_req(0, gen_seed=s, **kw)], logits).next_token_ids.item()
            for s in range(40)}


def test_top_p_top_k_and_min_p_restrict_support():
    """Each case's logits put most of the mass outside {3, 4} (the control: sampling
    without the cut sees other tokens), and the cut leaves exactly {3, 4}."""
    # top_p 0.6: p(3) = 0.34, p(4) = 0.31 (0.65 together), 48 others 0.0073 each.
    logits = torch.full((1, V), 1.15)
    logits[0, 3], logits[0, 4] = 5.0, 4.9
    assert not _seen(logits, temperature=1.0) <= {3, 4}
    assert _seen(logits, temperature=1.0, top_p=0.6) == {3, 4}
    # min_p 0.5: the others have e^-1 = 0.37 of the top probability, 90% of the mass.
    logits = torch.full((1, V), 4.0)
    logits[0, 3], logits[0, 4] = 5.0, 4.9
    assert not _seen(logits, temperature=1.0) <= {3, 4}
    assert _seen(logits, temperature=1.0, min_p=0.5) == {3, 4}
    # top_k 2 at temperature 5: the others hold about half the mass.
    logits = torch.full((1, V), -10.0)
    logits[0, 3], logits[0, 4] = 5.0, 4.9
    assert not _seen(logits, temperature=5.0) <= {3, 4}
    assert _seen(logits, temperature=5.0, top_k=2) == {3, 4}


def test_penalties_change_greedy_choice():
    logits = torch.zeros(1, V)
    logits[0, 7] = 1.0
    logits[0, 8] = 0.9
    # token 7 was already generated twice: frequency penalty 0.1 * 2 pushes it under token 8
    req = make_req(0, temperature=0.0, frequency_penalty=0.1)
    req.output_counts[7] = 2
    assert sample([req], logits).next_token_ids.item() == 8
    req = make_req(0, temperature=0.0, presence_penalty=0.2)
    req.output_counts[7] = 1
    assert sample([req], logits).next_token_ids.item() == 8
    # repetition penalty covers prompt tokens too (input ids 1, 2, 3)
    logits = torch.zeros(1, V)
    logits[0, 2] = 1.0
    logits[0, 9] = 0.8
    req = make_req(0, temperature=0.0, repetition_penalty=1.5)
    assert sample([req], logits).next_token_ids.item() == 9


def test_logprobs_of_chosen_and_top():
    logits = torch.randn(2, V)
    reqs = [make_req(0, temperature=0.0, logprobs=True, top_logprobs=3), make_req(1, temperature=0.0)]
    out = sample(reqs, logits)
    lp = torch.log_softmax(logits, -1)
    first, second = out.token_logprobs()
    assert abs(first.logprob - lp[0].max().item()) < 1e-5
    assert [t for t, _ in first.top] == lp[0].topk(3).indices.tolist()
    assert second is None


def _ops_run(reqs, logits) -> set[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        sample(reqs, logits)
    return {e.key for e in prof.key_averages()}


def test_greedy_and_plain_sampling_never_sort_the_vocabulary(monkeypatch):
    """The torch path (where the CPU sampling kernel did not build): only a top-k/top-p cut
    sorts; greedy rows are an argmax and temperature-only rows a softmax and a draw (the
    sort is a V-wide op per row per step). The kernel sorts nothing even for top-p
    (tests/unit/test_sampling_kernel.py)."""
    import radixlm.executor.sampler as sampler_mod

    monkeypatch.setattr(sampler_mod, "sampling_kernel", lambda: None)
    logits = torch.randn(4, V)
    sorts = {"aten::sort", "aten::argsort", "aten::topk", "aten::msort"}
    greedy = [make_req(i, temperature=0.0) for i in range(4)]
    plain = [make_req(0, temperature=0.0), make_req(1, temperature=0.8),
             make_req(2, temperature=1.0, min_p=0.1), make_req(3, temperature=1.3)]
    assert not _ops_run(greedy, logits) & sorts
    assert not _ops_run(plain, logits) & sorts
    assert _ops_run([make_req(0, temperature=1.0, top_p=0.9)], logits[:1]) & sorts


def test_a_row_without_a_valid_distribution_takes_its_greedy_token():
    """Logits that make no distribution (an inf: softmax gives NaN) cost that row its draw,
    not the scheduler: it gets its greedy token, its neighbours sample as usual."""
    logits = torch.randn(2, V)
    logits[0, 7] = float("inf")
    reqs = [make_req(0, temperature=1.0), make_req(1, gen_seed=3, temperature=1.0)]
    out = sample(reqs, logits.clone()).next_token_ids.tolist()
    assert out[0] == 7
    assert out[1] == sample([make_req(1, gen_seed=3, temperature=1.0)], logits[1:].clone()
                            ).next_token_ids.tolist()[0]


def test_temperature_sampling_draws_the_softmax_distribution():
    """4000 rows of one logits vector, each with its own seeded generator: the token
    counts match softmax(logits / T) (Pearson's chi-square, 7 degrees of freedom: 24.3
    is the 0.1% quantile, so a draw biased by even one token's mass fails)."""
    logits = torch.full((V,), -30.0)
    logits[:8] = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, 0.25])
    n, temperature = 4000, 0.8
    reqs = [make_req(i, gen_seed=1000 + i, temperature=temperature) for i in range(n)]
    ids = sample(reqs, logits.expand(n, V).clone()).next_token_ids
    expected = torch.softmax(logits / temperature, dim=-1)[:8] * n
    counts = torch.bincount(ids, minlength=V).float()
    assert counts[8:].sum() == 0
    chi2 = float(((counts[:8] - expected) ** 2 / expected).sum())
    assert chi2 < 24.3, (chi2, counts[:8].tolist(), expected.tolist())


def test_candidate_top_k_p_cut_equals_the_full_sort():
    """The CPU cut (top 1024 candidates, full sort where the cut falls beyond them) keeps
    exactly the tokens the full sort keeps: peaked and flat rows, top-k above the
    candidates, rows without a cut next to rows with one."""
    torch.manual_seed(0)
    vocab = 5000
    probs = torch.softmax(torch.randn(6, vocab) * torch.tensor([[4.0], [4.0], [0.01], [4.0], [1.0], [4.0]]), -1)
    top_ks = torch.tensor([vocab, 40, vocab, 3000, vocab, vocab])
    top_ps = torch.tensor([0.9, 0.95, 0.9, 1.0, 0.999, 1.0])
    fast = Sampler._top_k_p(probs, top_ks, top_ps)
    full = Sampler._top_k_p_sorted(probs, top_ks, top_ps)
    assert torch.equal(fast[:5], full[:5])
    # No cut asked: every token stays (the full sort's float cumsum reaches 1.0 early
    # and drops a tail of ~1e-9 mass there).
    assert torch.equal(fast[5], probs[5])
    kept = (fast > 0).sum(-1).tolist()
    assert kept[1] <= 40 and kept[2] > 1024 and kept[3] == 3000 and kept[5] == vocab
