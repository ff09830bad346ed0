"""The HTTP app end to end on CPU: FastAPI TestClient -> real TokenizerManager -> real ZMQ
-> FakeEngine (a deterministic scheduler+detokenizer stand-in)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.server_fakes import FakeStack, fake_stack

CONTEXT_LEN = 256


@pytest.fixture(scope="module")
def stack() -> Iterator[FakeStack]:
    with fake_stack(context_len=CONTEXT_LEN) as s:
        yield s


@pytest.fixture(scope="module")
def client(stack: FakeStack) -> Iterator[TestClient]:
    with TestClient(stack.app) as c:
        yield c


def sse(text: str) -> list[Any]:
    """Parse an SSE body: a list of JSON events, then the "[DONE]" sentinel."""
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    events = [block.removeprefix("data: ") for block in text.split("\n\n") if block]
    assert all(block.startswith("data: ") for block in text.split("\n\n") if block)
    return [json.loads(e) for e in events[:-1]] + [events[-1]]


def post(client: TestClient, path: str, body: dict[str, Any], status: int = 200) -> Any:
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    return sse(r.text) if body.get("stream") and status == 200 else r.json()


def n_tokens(stack: FakeStack, text: str) -> int:
    return len(stack.tokenizer(text).input_ids)


# --- completions -------------------------------------------------------------------------


def test_models(client: TestClient) -> None:
    data = client.get("/v1/models").json()
    assert data["object"] == "list" and [m["id"] for m in data["data"]] == ["tiny"]


def test_completion(client: TestClient, stack: FakeStack) -> None:
    body = post(client, "/v1/completions", {"model": "tiny", "prompt": "hello world the cat",
                                            "max_tokens": 5})
    assert body["id"].startswith("cmpl-") and body["object"] == "text_completion"
    assert isinstance(body["created"], int) and body["model"] == "tiny"
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "length"
    assert choice["text"] == "mat and dog ran big" and choice["logprobs"] is None
    usage = body["usage"]
    assert usage["prompt_tokens"] == n_tokens(stack, "hello world the cat") == 4
    assert usage["completion_tokens"] == 5 and usage["total_tokens"] == 9
    assert "cached_tokens" in usage["prompt_tokens_details"]


def test_completion_logprobs_shape(client: TestClient) -> None:
    body = post(client, "/v1/completions", {"prompt": "hello", "max_tokens": 4, "logprobs": 2})
    lp = body["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 4
    assert len(lp["text_offset"]) == 4 and lp["text_offset"] == sorted(lp["text_offset"])
    for tok, top in zip(lp["tokens"], lp["top_logprobs"]):
        assert tok in top and 1 <= len(top) <= 3
        assert all(isinstance(v, float) for v in top.values())


def test_completion_list_of_prompts_times_n(client: TestClient, stack: FakeStack) -> None:
    prompts = ["hello", "world cat dog"]
    body = post(client, "/v1/completions", {"prompt": prompts, "n": 2, "max_tokens": 3, "seed": 7})
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    # With a seed, choice i uses seed + i: the two choices of a prompt differ.
    assert body["choices"][0]["text"] != body["choices"][1]["text"]
    assert body["usage"]["prompt_tokens"] == sum(n_tokens(stack, p) for p in prompts)
    assert body["usage"]["completion_tokens"] == 4 * 3


def test_completion_token_id_prompts(client: TestClient, stack: FakeStack) -> None:
    assert post(client, "/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 2})["usage"][
        "prompt_tokens"] == 3
    body = post(client, "/v1/completions", {"prompt": [[5], [6, 7]], "max_tokens": 2})
    assert len(body["choices"]) == 2 and body["usage"]["prompt_tokens"] == 3
    err = post(client, "/v1/completions", {"prompt": [5, 10**6], "max_tokens": 2}, 400)
    assert "out of range" in err["error"]["message"]


def test_completion_stream_matches_non_stream(client: TestClient) -> None:
    req = {"prompt": "hello world", "max_tokens": 6, "logprobs": 1, "seed": 3}
    full = post(client, "/v1/completions", req)["choices"][0]
    events = post(client, "/v1/completions", {**req, "stream": True,
                                              "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert "".join(c["choices"][0]["text"] for c in chunks) == full["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["object"] == "text_completion" for c in chunks)
    tokens = [t for c in chunks for t in c["choices"][0]["logprobs"]["tokens"]]
    assert tokens == full["logprobs"]["tokens"]
    offsets = [o for c in chunks for o in c["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == full["logprobs"]["text_offset"]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6


def test_stream_without_usage_has_no_usage_chunk(client: TestClient) -> None:
    events = post(client, "/v1/completions", {"prompt": "hello", "max_tokens": 2, "stream": True})
    assert all(e == "[DONE]" or e["choices"] for e in events)


def test_stop_string_and_stop_token(client: TestClient, stack: FakeStack) -> None:
    c = post(client, "/v1/completions", {"prompt": "hello world the cat", "max_tokens": 10,
                                         "stop": ["dog"]})["choices"][0]
    assert c["finish_reason"] == "stop" and c["stop_reason"] == "dog"
    assert c["text"] == "mat and "
    ran = stack.tokenizer.convert_tokens_to_ids("ran")
    c = post(client, "/v1/completions", {"prompt": "hello world the cat", "max_tokens": 10,
                                         "stop_token_ids": [ran]})["choices"][0]
    assert c["finish_reason"] == "stop" and c["stop_reason"] == ran
    assert c["text"] == "mat and dog"


def test_default_max_tokens_is_openais_16(client: TestClient) -> None:
    body = post(client, "/v1/completions", {"prompt": "hello world"})
    assert body["usage"]["completion_tokens"] == 16
    assert body["choices"][0]["finish_reason"] == "length"
    # Less when the context has less room left.
    body = post(client, "/v1/completions", {"prompt": [1] * (CONTEXT_LEN - 5)})
    assert body["usage"]["completion_tokens"] == 5


def test_seed_reproducible(client: TestClient) -> None:
    req = {"prompt": "hello", "max_tokens": 5, "seed": 11, "temperature": 0.8}
    a = post(client, "/v1/completions", req)["choices"][0]["text"]
    b = post(client, "/v1/completions", req)["choices"][0]["text"]
    c = post(client, "/v1/completions", {**req, "seed": 12})["choices"][0]["text"]
    assert a == b != c


# --- chat --------------------------------------------------------------------------------


def test_chat(client: TestClient, stack: FakeStack) -> None:
    messages = [{"role": "system", "content": "yes"}, {"role": "user", "content": "hello"}]
    body = post(client, "/v1/chat/completions", {"model": "tiny", "messages": messages,
                                                 "max_completion_tokens": 3})
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert choice["finish_reason"] == "length" and choice["logprobs"] is None
    prompt = stack.tokenizer.apply_chat_template(messages, tokenize=False,
                                                 add_generation_prompt=True)
    expected = len(stack.tokenizer(prompt, add_special_tokens=False).input_ids)
    assert body["usage"]["prompt_tokens"] == expected and body["usage"]["completion_tokens"] == 3


def test_chat_text_parts(client: TestClient) -> None:
    msg = {"role": "user", "content": [{"type": "text", "text": "hello"},
                                       {"type": "text", "text": "world"}]}
    post(client, "/v1/chat/completions", {"messages": [msg], "max_tokens": 1})
    img = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    err = post(client, "/v1/chat/completions", {"messages": [img], "max_tokens": 1}, 400)
    assert "not supported" in err["error"]["message"]


def test_chat_logprobs_shape(client: TestClient) -> None:
    body = post(client, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3,
        "logprobs": True, "top_logprobs": 2})
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 3
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["bytes"] == list(entry["token"].encode())
        assert len(entry["top_logprobs"]) == 2
        assert all(set(t) == {"token", "logprob", "bytes"} for t in entry["top_logprobs"])


def test_chat_stream_n2(client: TestClient) -> None:
    req = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "n": 2,
           "seed": 5}
    full = post(client, "/v1/chat/completions", req)
    events = post(client, "/v1/chat/completions", {**req, "stream": True})[:-1]
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    firsts = {}
    texts = {0: "", 1: ""}
    finish = {}
    for e in events:
        (c,) = e["choices"]
        firsts.setdefault(c["index"], c["delta"])
        texts[c["index"]] += c["delta"].get("content", "")
        if c["finish_reason"]:
            finish[c["index"]] = c["finish_reason"]
    assert all(d.get("role") == "assistant" for d in firsts.values()) and len(firsts) == 2
    assert texts == {c["index"]: c["message"]["content"] for c in full["choices"]}
    assert texts[0] != texts[1] and finish == {0: "length", 1: "length"}


# --- native /generate --------------------------------------------------------------------


def test_native_generate(client: TestClient, stack: FakeStack) -> None:
    body = post(client, "/generate", {"text": "hello world the cat",
                                      "sampling_params": {"max_new_tokens": 3}})
    assert body["text"] == "mat and dog" and len(body["output_ids"]) == 3
    meta = body["meta_info"]
    assert meta["prompt_tokens"] == 4 and meta["completion_tokens"] == 3
    assert meta["finish_reason"] == {"type": "length", "length": 3}
    stop = post(client, "/generate", {"input_ids": [5, 6, 7, 8],
                                      "sampling_params": {"max_new_tokens": 9, "stop": "and"}})
    assert stop["meta_info"]["finish_reason"] == {"type": "stop", "matched": "and"}
    batch = post(client, "/generate", {"text": ["hello", "world"],
                                       "sampling_params": {"max_new_tokens": 2}})
    assert len(batch) == 2 and all(len(b["output_ids"]) == 2 for b in batch)
    events = post(client, "/generate", {"text": "hello world the cat", "stream": True,
                                        "sampling_params": {"max_new_tokens": 3}})
    assert events[-2]["text"] == "mat and dog"  # cumulative, as SGLang streams it
    assert events[-2]["meta_info"]["finish_reason"]["type"] == "length"
    post(client, "/generate", {"text": "a", "input_ids": [1]}, 400)


# --- errors ------------------------------------------------------------------------------

MSG = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize("path,body,needle", [
    ("/v1/completions", {"prompt": "hello", "max_tokens": -1}, "max_tokens"),
    ("/v1/completions", {"prompt": "hello", "temperature": -0.5}, "temperature"),
    ("/v1/completions", {"prompt": "hello", "top_p": 0}, "top_p"),
    ("/v1/completions", {"prompt": "hello", "top_p": 1.5}, "top_p"),
    ("/v1/completions", {"prompt": "hello", "max_tokens": "5"}, "max_tokens"),
    ("/v1/completions", {"prompt": 5}, "prompt"),
    ("/v1/completions", {"prompt": "hello", "n": 0}, "n"),
    ("/v1/completions", {"prompt": "hello", "prompt_logprobs": -1},
     "prompt_logprobs=-1 (the whole vocabulary) is not supported: give 0 to 20"),
    ("/v1/completions", {"prompt": "hello", "prompt_logprobs": 21}, "prompt_logprobs"),
    ("/v1/completions", {"prompt": "hello", "stream_options": {"include_usage": True}},
     "stream_options"),
    ("/v1/completions", {"prompt": "hello", "truncate_prompt_tokens": 0},
     "truncate_prompt_tokens"),
    ("/v1/completions", {"prompt": "hello", "max_tokens": 1000}, "maximum context length is 256"),
    ("/v1/completions", {"prompt": "hello " * 300}, "maximum context length is 256"),
    ("/v1/completions", {"prompt": "hello", "stop_token_ids": [-1]}, "stop_token_ids"),
    ("/v1/chat/completions", {"model": "tiny"}, "messages"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": MSG, "temperature": "hot"}, "temperature"),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 2, "stream": True,
                              "top_p": 2.0}, "top_p"),
    ("/v1/chat/completions", {"messages": MSG, "top_logprobs": 3}, "logprobs"),
    ("/v1/chat/completions", {"messages": MSG, "prompt_logprobs": 1, "stream": True},
     "prompt_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, "role"),
    ("/generate", {"text": "hello", "sampling_params": {"top_k": -5}}, "top_k"),
])
def test_bad_requests_are_400(client: TestClient, path: str, body: dict[str, Any],
                              needle: str) -> None:
    err = post(client, path, body, 400)["error"]
    assert err["code"] == 400 and err["type"] == "invalid_request_error"
    assert needle in err["message"]
    assert post(client, "/v1/completions", {"prompt": "hello", "max_tokens": 1})["choices"]


@pytest.mark.parametrize("content", [b"{bad json", b"", b"[1, 2]", b"null"])
def test_malformed_json_is_400(client: TestClient, content: bytes) -> None:
    r = client.post("/v1/chat/completions", content=content,
                    headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == 400
    assert client.get("/health").status_code == 200


def test_engine_error_is_500_and_server_survives(client: TestClient) -> None:
    err = post(client, "/v1/completions", {"prompt": "hello boom", "max_tokens": 3}, 500)
    assert err["error"]["code"] == 500 and "fake engine error" in err["error"]["message"]
    events = post(client, "/v1/completions", {"prompt": "hello boom", "max_tokens": 3,
                                              "stream": True})
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == 500
    assert client.get("/health").status_code == 200
    assert post(client, "/v1/completions", {"prompt": "hello", "max_tokens": 1})["choices"]


def test_internal_error_is_500(client: TestClient, stack: FakeStack,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(prompt: object) -> list[int]:
        raise RuntimeError("tokenizer exploded")

    monkeypatch.setattr(stack.tokenizer_manager, "tokenize_prompt", broken)
    err = post(client, "/v1/completions", {"prompt": "hello", "max_tokens": 1}, 500)["error"]
    assert err["code"] == 500 and "tokenizer exploded" in err["message"]
    monkeypatch.undo()
    assert post(client, "/v1/completions", {"prompt": "hello", "max_tokens": 1})["choices"]


def test_unknown_route_has_openai_error_body(client: TestClient) -> None:
    r = client.get("/v1/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == 404


def test_health_reflects_tokenizer_manager(client: TestClient, stack: FakeStack) -> None:
    assert client.get("/health").status_code == 200
    assert client.head("/health").status_code == 200  # load balancers probe with HEAD
    stack.tokenizer_manager.healthy = False
    try:
        r = client.get("/health")
        assert r.status_code == 503 and r.json()["error"]["code"] == 503
        assert client.head("/health").status_code == 503
    finally:
        stack.tokenizer_manager.healthy = True


def test_api_key() -> None:
    with fake_stack(api_key="sekret") as s, TestClient(s.app) as c:
        body = {"prompt": "hello", "max_tokens": 1}
        for headers in [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}]:
            r = c.post("/v1/completions", json=body, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == 401
        assert c.get("/v1/models").status_code == 401
        assert c.get("/health").status_code == 200
        ok = c.post("/v1/completions", json=body, headers={"Authorization": "Bearer sekret"})
        assert ok.status_code == 200 and ok.json()["choices"]
