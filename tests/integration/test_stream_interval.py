"""--stream-interval on a tiny random Llama: a streamed request's messages carry its first
token at once, then chunks of the interval, the rest on finish; the text, token ids and
logprobs are the same as with interval 1 and as unstreamed; no KV leaks."""

import pytest

from radixlm import SamplingParams
from radixlm.engine import Engine
from tests.engine_checks import assert_all_slots_back as all_back

PROMPTS = [[5, 6, 7, 8], [9, 10, 11], list(range(20, 50))]


def params(max_new: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new, temperature=0.0, ignore_eos=True,
                          logprobs=True, top_logprobs=2)


def stream_all(eng: Engine, max_news: list[int]) -> dict[str, list]:
    """Submit PROMPTS streamed (one max_new_tokens each); every message of each, in order."""
    rids = [eng.submit(p, params(m), stream=True) for p, m in zip(PROMPTS, max_news)]
    msgs: dict[str, list] = {r: [] for r in rids}
    while not all(eng.result(r)["finished"] for r in rids):
        for out in eng.step():
            msgs[out.rid].append(out)
    eng.settle()
    return {r: msgs[r] for r in rids}


@pytest.fixture(scope="module")
def engines(tiny_llama_dir):
    mk = lambda n: Engine(model=tiny_llama_dir, max_total_tokens=2048,  # noqa: E731
                          disable_overlap_schedule=True, stream_interval=n)
    return {1: mk(1), 4: mk(4)}


@pytest.mark.parametrize("interval", [1, 4])
def test_chunks_follow_the_interval_and_end_on_finish(engines, interval):
    max_news = [17, 4, 10]
    runs = stream_all(engines[interval], max_news)
    for msgs, max_new in zip(runs.values(), max_news):
        sizes = [len(m.token_ids_delta) for m in msgs]
        assert sum(sizes) == max_new
        assert sizes[0] == 1  # the first token goes out at once (TTFT)
        assert all(s == interval for s in sizes[1:-1]), sizes
        assert 1 <= sizes[-1] <= interval, sizes
        assert [m.finish_reason for m in msgs] == [None] * (len(msgs) - 1) + ["length"]
        assert all(len(m.logprobs) == len(m.token_ids_delta) for m in msgs)
    all_back(engines[interval], 2048)


def test_text_ids_and_logprobs_equal_interval_1_and_unstreamed(engines):
    max_news = [17, 4, 10]
    one, four = (stream_all(engines[n], max_news) for n in (1, 4))
    unstreamed = engines[1].generate(PROMPTS, [params(m) for m in max_news])
    for a, b, u in zip(one.values(), four.values(), unstreamed):
        text = lambda msgs: "".join(m.text_delta for m in msgs)  # noqa: E731
        ids = lambda msgs: [t for m in msgs for t in m.token_ids_delta]  # noqa: E731
        lps = lambda msgs: [lp for m in msgs for lp in m.logprobs]  # noqa: E731
        assert ids(b) == ids(a) == u["output_ids"]
        assert text(b) == text(a) == u["text"]
        assert lps(b) == lps(a)
        assert len(lps(b)) == len(ids(b))
    for n in (1, 4):
        all_back(engines[n], 2048)


def test_rejects_an_interval_below_one(tiny_llama_dir):
    with pytest.raises(ValueError, match="stream_interval"):
        Engine(model=tiny_llama_dir, max_total_tokens=2048, stream_interval=0)
