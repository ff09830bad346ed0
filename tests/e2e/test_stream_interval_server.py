"""The real server with --stream-interval (and the detokenizer in the API process): SSE
chunks carry the first token at once, then the interval's tokens, the rest with the
finish; the streamed text, logprobs, stop strings and n > 1 equal the unstreamed ones."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import requires_default_model
from tests.server_harness import running_server


pytestmark = [pytest.mark.slow, requires_default_model,
              pytest.mark.usefixtures("pool_invariant")]

PROMPT = "The capital of France is"
MODES = {"interval4": ["--stream-interval", "4"],
         "interval3-detok-in-api": ["--stream-interval", "3", "--detokenizer-mode", "api"]}


@pytest.fixture(scope="module", params=list(MODES))
def mode(request: Any) -> str:
    return request.param


@pytest.fixture(scope="module")
def server(mode: str) -> Iterator[str]:
    with running_server(None, "--max-total-tokens", "4096", "--max-running-requests", "8",
                        *MODES[mode]) as srv:
        yield srv.url


def interval_of(mode: str) -> int:
    return int(MODES[mode][1])


def sse(url: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    events = []
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=300) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data:") and line != "data: [DONE]":
                events.append(json.loads(line[len("data:"):]))
    return events


def unary(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(url + path, json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def flush(url: str) -> None:
    """Empty the radix cache: the next request prefills its whole prompt. (A cached prompt
    leaves only its last token to an extend, whose logits differ from a full prefill's in
    bf16 by ~1e-2: not what this module compares.)"""
    assert httpx.post(url + "/flush_cache", timeout=60).status_code == 200


def test_chunks_follow_the_interval_and_text_equals_unstreamed(server: str, mode: str) -> None:
    n = interval_of(mode)
    body = {"prompt": PROMPT, "max_tokens": 17, "temperature": 0, "ignore_eos": True,
            "logprobs": 1}
    flush(server)
    want = unary(server, "/v1/completions", body)["choices"][0]
    flush(server)
    chunks = [e["choices"][0] for e in sse(server, "/v1/completions", body) if e["choices"]]
    sizes = [len(c["logprobs"]["tokens"]) for c in chunks]
    assert sum(sizes) == 17 and sizes[0] == 1, sizes
    assert all(s == n for s in sizes[1:-1]) and 1 <= sizes[-1] <= n, sizes
    assert [c["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    assert "".join(c["text"] for c in chunks) == want["text"]
    tokens = [t for c in chunks for t in c["logprobs"]["tokens"]]
    values = [v for c in chunks for v in c["logprobs"]["token_logprobs"]]
    assert tokens == want["logprobs"]["tokens"]
    assert values == pytest.approx(want["logprobs"]["token_logprobs"], abs=1e-3)
    # text_offset runs on across chunks as in the unstreamed answer
    offsets = [o for c in chunks for o in c["logprobs"]["text_offset"]]
    assert offsets == want["logprobs"]["text_offset"]


def test_stop_string_cut_the_same_way(server: str) -> None:
    body = {"prompt": "1, 2, 3, 4,", "max_tokens": 16, "temperature": 0}
    full = unary(server, "/v1/completions", body)["choices"][0]["text"]
    words = full.split()
    assert len(words) >= 3, full
    body["stop"] = [words[2]]
    cut = unary(server, "/v1/completions", body)["choices"][0]
    chunks = [e["choices"][0] for e in sse(server, "/v1/completions", body) if e["choices"]]
    assert cut["finish_reason"] == chunks[-1]["finish_reason"] == "stop"
    assert "".join(c["text"] for c in chunks) == cut["text"] == full[:full.index(words[2])]


def test_chat_n2_streamed_equals_unstreamed(server: str) -> None:
    body = {"messages": [{"role": "user", "content": "Name three colors."}], "max_tokens": 14,
            "n": 2, "temperature": 0.9, "seed": 11}
    flush(server)  # (both requests prefill the whole prompt: see flush)
    want = {c["index"]: c for c in unary(server, "/v1/chat/completions", body)["choices"]}
    text = {0: "", 1: ""}
    finish = {}
    flush(server)
    for e in sse(server, "/v1/chat/completions", body):
        for c in e["choices"]:
            text[c["index"]] += c["delta"].get("content") or ""
            if c["finish_reason"]:
                finish[c["index"]] = c["finish_reason"]
    assert text == {i: want[i]["message"]["content"] for i in (0, 1)}
    assert finish == {i: want[i]["finish_reason"] for i in (0, 1)}
