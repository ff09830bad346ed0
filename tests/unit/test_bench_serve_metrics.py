"""bench serve's client and metric arithmetic against a scripted fake server: known token
timings (a fake clock advanced by the server's script) -> known TTFT/ITL/TPOT/throughput."""

from __future__ import annotations

import asyncio
import json
import math

import httpx
import pytest

from radixlm.bench.datasets import BenchRequest
from radixlm.bench.serve_client import Target, completion_body, send_request
from radixlm.bench.serve_load import LoadConfig, arrival_gaps, run_load
from radixlm.bench.serve_metrics import RequestResult, compute_metrics


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def sse(obj: dict | str) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


def scripted_server(clock: FakeClock, script: list[tuple[float, str]], usage: dict | None,
                    seen: list[dict]) -> httpx.MockTransport:
    """Every request gets `script`: (seconds to wait, text) per chunk, then the usage chunk
    (when given) and [DONE]. Waiting = advancing the fake clock before the chunk is sent."""

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))

        async def body():
            yield sse({"choices": [{"index": 0, "text": ""}]})  # a role-only first chunk
            for wait, text in script:
                await asyncio.sleep(0)  # let other requests' streams run in between
                clock.now += wait
                yield sse({"choices": [{"index": 0, "text": text, "finish_reason": None}]})
            if usage is not None:
                yield sse({"choices": [], "usage": usage})
            yield sse("[DONE]")

        return httpx.Response(200, content=body(), headers={"content-type": "text/event-stream"})

    return httpx.MockTransport(handler)


SCRIPT = [(0.5, "Hello"), (0.1, " wor"), (0.2, "ld")]
USAGE = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15,
         "prompt_tokens_details": {"cached_tokens": 4}}


def run_requests(script, usage, requests, load=LoadConfig(max_concurrency=1, show_progress=False),
                 target=Target("fake", "http://fake")):
    clock, seen = FakeClock(), []

    async def go():
        async with httpx.AsyncClient(transport=scripted_server(clock, script, usage, seen)) as c:
            return await run_load(c, target, requests, load,
                                  count_tokens=lambda text: len(text.split()), clock=clock)

    results, duration = asyncio.run(go())
    return results, duration, seen


def test_one_request_timings_and_usage() -> None:
    results, duration, seen = run_requests(SCRIPT, USAGE, [BenchRequest("p q r", 10, 3)])
    (r,) = results
    assert r.success and r.error == ""
    assert r.ttft == pytest.approx(0.5)
    assert r.itl == pytest.approx([0.1, 0.2])
    assert r.latency == pytest.approx(0.8)
    assert (r.output_len, r.prompt_len) == (3, 10)  # usage's completion tokens; our count
    assert (r.cached_tokens, r.server_prompt_tokens) == (4, 12)
    assert r.generated_text == "Hello world"
    assert duration == pytest.approx(0.8)
    assert seen == [completion_body(None, "p q r", 3)]
    assert seen[0]["ignore_eos"] and seen[0]["stream_options"] == {"include_usage": True}


def test_extra_request_body_is_merged_into_every_request() -> None:
    """--extra-request-body (bench_serving's): its keys override the greedy defaults."""
    extra = {"temperature": 1.0, "top_p": 0.9}
    _, _, seen = run_requests(SCRIPT, USAGE, [BenchRequest("a", 10, 3), BenchRequest("b", 10, 3)],
                              target=Target("fake", "http://fake", extra_body=extra))
    assert [(b["temperature"], b["top_p"], b["ignore_eos"]) for b in seen] == [(1.0, 0.9, True)] * 2


def test_metrics_of_two_sequential_requests() -> None:
    reqs = [BenchRequest("a", 10, 3), BenchRequest("b", 30, 3)]
    results, duration, _ = run_requests(SCRIPT, USAGE, reqs)
    assert duration == pytest.approx(1.6)  # concurrency 1: one after the other
    m = compute_metrics(results, duration)
    assert m["completed"] == 2 and m["failed"] == 0
    assert m["total_input_tokens"] == 40 and m["total_output_tokens"] == 6
    assert m["request_throughput"] == pytest.approx(2 / 1.6)
    assert m["input_throughput"] == pytest.approx(40 / 1.6)
    assert m["output_throughput"] == pytest.approx(6 / 1.6)
    assert m["total_throughput"] == pytest.approx(46 / 1.6)
    assert m["mean_ttft_ms"] == pytest.approx(500) and m["p99_ttft_ms"] == pytest.approx(500)
    assert m["mean_itl_ms"] == pytest.approx(150) and m["median_itl_ms"] == pytest.approx(150)
    assert m["max_itl_ms"] == pytest.approx(200)
    # TPOT = (0.8 - 0.5) / (3 - 1) per request.
    assert m["mean_tpot_ms"] == pytest.approx(150) and m["median_tpot_ms"] == pytest.approx(150)
    assert m["median_e2e_latency_ms"] == pytest.approx(800)
    assert m["concurrency"] == pytest.approx(1.0)
    assert m["total_cached_tokens"] == 8 and m["cache_hit_rate"] == pytest.approx(8 / 24)


def test_all_at_once_overlaps_requests() -> None:
    """Without a concurrency cap both requests are in flight together: the fake clock is
    shared, so the wall time is shorter than the sum of the latencies."""
    reqs = [BenchRequest("a", 10, 3), BenchRequest("b", 10, 3)]
    results, duration, _ = run_requests(SCRIPT, USAGE, reqs,
                                        LoadConfig(max_concurrency=None, show_progress=False))
    assert all(r.success for r in results)
    assert duration < sum(r.latency for r in results)


def test_no_usage_counts_chunks_and_reports_no_hit_rate() -> None:
    results, duration, _ = run_requests(SCRIPT, None, [BenchRequest("a", 5, 3)])
    assert results[0].output_len == 3 and results[0].cached_tokens is None
    m = compute_metrics(results, duration)
    assert m["cache_hit_rate"] is None and m["total_cached_tokens"] is None


def test_llama_server_timings_give_the_cache_hit_rate() -> None:
    clock, seen = FakeClock(), []

    async def handler(request: httpx.Request) -> httpx.Response:
        body = sse({"choices": [{"text": "x"}]}) + sse(
            {"choices": [{"text": "", "finish_reason": "length"}],
             "timings": {"cache_n": 6, "prompt_n": 2}}) + sse("[DONE]")
        return httpx.Response(200, content=body)

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
            return await send_request(c, Target("l", "http://l"), "p", 8, 1, clock)

    r = asyncio.run(go())
    assert r.success and (r.cached_tokens, r.server_prompt_tokens) == (6, 8)


def test_http_error_is_a_failed_result() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"message": "bad"}})

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
            return await send_request(c, Target("e", "http://e"), "p", 1, 4, FakeClock())

    r = asyncio.run(go())
    assert not r.success and r.error.startswith("HTTP 400") and "bad" in r.error
    m = compute_metrics([r, RequestResult(success=True, prompt_len=2, output_len=1, latency=1.0,
                                          ttft=1.0)], 2.0)
    assert m["completed"] == 1 and m["failed"] == 1 and m["total_input_tokens"] == 2
    assert m["mean_tpot_ms"] == 0.0  # no request with more than one output token


def test_multi_turn_appends_answer_and_follow_up() -> None:
    conv = BenchRequest("sys q1", 2, 3, follow_ups=(" q2", " q3"))
    results, _, seen = run_requests(SCRIPT, USAGE, [conv])
    assert len(results) == 3 and all(r.success for r in results)
    assert [s["prompt"] for s in seen] == ["sys q1", "sys q1Hello world q2",
                                           "sys q1Hello world q2Hello world q3"]
    # Later turns are counted with the given counter (whitespace words here).
    assert [r.prompt_len for r in results] == [2, 4, 6]


def test_arrival_gaps() -> None:
    assert arrival_gaps(3, math.inf, 0) == [0.0, 0.0, 0.0]
    a = arrival_gaps(2000, 4.0, seed=1)
    assert a == arrival_gaps(2000, 4.0, seed=1) and a != arrival_gaps(2000, 4.0, seed=2)
    assert sum(a) / len(a) == pytest.approx(0.25, rel=0.1)  # mean gap 1 / rate
    with pytest.raises(ValueError):
        LoadConfig(request_rate=0).validate()
    with pytest.raises(ValueError):
        compute_metrics([], 0.0)


def test_unary_request_ttft_is_its_latency() -> None:
    """--disable-stream: one JSON answer; TTFT = E2E latency, no ITLs, usage's counts."""
    clock, seen = FakeClock(), []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        clock.now += 0.75
        return httpx.Response(200, json={"choices": [{"index": 0, "text": "Hi there"}],
                                         "usage": USAGE})

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
            return await send_request(c, Target("u", "http://u", stream=False), "p q", 2, 3,
                                      clock)

    r = asyncio.run(go())
    assert r.success and r.generated_text == "Hi there" and r.itl == []
    assert r.ttft == r.latency == pytest.approx(0.75)
    assert (r.output_len, r.cached_tokens) == (3, 4)
    assert seen == [completion_body(None, "p q", 3, stream=False)]
    assert seen[0]["stream"] is False and "stream_options" not in seen[0]
