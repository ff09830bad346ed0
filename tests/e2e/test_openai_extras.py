"""The plain endpoints as vLLM's and SGLang's own suites use them (default model, one
server, short generations): echo (text, streaming, n), the default max_tokens of 16,
stream_options only with stream, GET /v1/models/{id}, /tokenize and /detokenize in both
peers' shapes, /version, continuous_usage_stats, truncate_prompt_tokens, return_token_ids,
continue_final_message, and 415 for a body that is not JSON."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.conftest import requires_default_model

pytestmark = [pytest.mark.slow, requires_default_model,
              pytest.mark.usefixtures("pool_invariant")]
openai = pytest.importorskip("openai")

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def server(default_server: str) -> str:
    return default_server  # the session's shared default-model server (e2e/conftest.py)


def _sse(resp: httpx.Response) -> list[dict]:
    return [json.loads(x[6:]) for x in resp.text.splitlines()
            if x.startswith("data: ") and x != "data: [DONE]"]


def test_echo_text_streaming_and_n(client: Any) -> None:
    plain = client.completions.create(model="m", prompt=PROMPT, max_tokens=4, temperature=0)
    r = client.completions.create(model="m", prompt=PROMPT, max_tokens=4, temperature=0,
                                  echo=True, n=2)
    assert len(r.choices) == 2
    for ch in r.choices:
        assert ch.text == PROMPT + plain.choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="m", prompt=PROMPT, max_tokens=4, temperature=0, echo=True, stream=True))
    assert streamed == PROMPT + plain.choices[0].text
    only_prompt = client.completions.create(model="m", prompt=PROMPT, max_tokens=0, echo=True)
    assert only_prompt.choices[0].text == PROMPT


def test_completion_default_max_tokens_is_16(client: Any) -> None:
    r = client.completions.create(model="m", prompt="Count: 1, 2, 3,", temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16 and r.choices[0].finish_reason == "length"


def test_stream_options_need_stream(client: Any) -> None:
    for call in (lambda: client.completions.create(
                     model="m", prompt=PROMPT, max_tokens=2, stream_options={"include_usage": True}),
                 lambda: client.chat.completions.create(
                     model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                     stream_options={"include_usage": True})):
        with pytest.raises(openai.BadRequestError) as e:
            call()
        assert "stream_options" in e.value.body["message"]


def test_model_by_id(client: Any, server: str) -> None:
    name = client.models.list().data[0].id
    card = client.models.retrieve(name)
    assert card.id == name and card.object == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_tokenize_detokenize_version(server: str) -> None:
    r = httpx.post(server + "/tokenize", json={"prompt": PROMPT}, timeout=30).json()
    assert r["count"] == len(r["tokens"]) > 0 and r["max_model_len"] > 0
    back = httpx.post(server + "/detokenize", json={"tokens": r["tokens"]}, timeout=30).json()
    assert back["text"] == back["prompt"] and back["text"].endswith(PROMPT)
    batch = httpx.post(server + "/tokenize", json={"prompt": ["a b", PROMPT],
                                                   "add_special_tokens": False},
                       timeout=30).json()  # SGLang's batch form
    assert isinstance(batch["tokens"][0], list) and batch["count"][1] == len(batch["tokens"][1])
    chat = httpx.post(server + "/tokenize", json={
        "messages": [{"role": "user", "content": "hi"}], "return_token_strs": True},
        timeout=30).json()  # vLLM's chat form
    assert chat["count"] == len(chat["token_strs"]) > 2
    bad = httpx.post(server + "/detokenize", json={"tokens": [10**9]}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    v = httpx.get(server + "/version", timeout=30).json()
    assert isinstance(v["version"], str) and v["version"]


def test_continuous_usage_stats(server: str) -> None:
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True,
                                               "continuous_usage_stats": True}}
    events = _sse(httpx.post(server + "/v1/completions", json=body, timeout=60))
    with_text = [e for e in events if e["choices"]]
    assert all("usage" in e for e in with_text)
    done = [e["usage"]["completion_tokens"] for e in with_text]
    assert done == sorted(done) and done[-1] == 4 and events[-1]["usage"]["completion_tokens"] == 4


def test_truncate_prompt_tokens_and_return_token_ids(server: str) -> None:
    full = httpx.post(server + "/tokenize", json={"prompt": PROMPT}, timeout=30).json()["tokens"]
    r = httpx.post(server + "/v1/completions", timeout=60, json={
        "prompt": PROMPT, "max_tokens": 3, "temperature": 0, "truncate_prompt_tokens": 3,
        "return_token_ids": True}).json()
    ch = r["choices"][0]
    assert r["usage"]["prompt_tokens"] == 3 and ch["prompt_token_ids"] == full[-3:]
    assert len(ch["token_ids"]) == r["usage"]["completion_tokens"]
    text = httpx.post(server + "/detokenize", json={"tokens": ch["token_ids"]},
                      timeout=30).json()["text"]
    assert text == ch["text"]
    events = _sse(httpx.post(server + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0,
        "stream": True, "return_token_ids": True}))
    assert events[0]["choices"][0]["prompt_token_ids"]
    streamed = [t for e in events for t in e["choices"][0].get("token_ids", [])]
    assert 1 <= len(streamed) <= 3


def test_continue_final_message(client: Any, server: str) -> None:
    msgs = [{"role": "user", "content": "Name a color."},
            {"role": "assistant", "content": "The color is"}]
    open_ids = httpx.post(server + "/tokenize", timeout=30, json={
        "messages": msgs, "add_generation_prompt": False, "continue_final_message": True}
    ).json()["tokens"]
    new_turn = httpx.post(server + "/tokenize", timeout=30, json={"messages": msgs}
                          ).json()["tokens"]
    text = httpx.post(server + "/detokenize", json={"tokens": open_ids}, timeout=30).json()
    assert text["text"].endswith("The color is") and len(new_turn) > len(open_ids)
    r = client.chat.completions.create(
        model="m", messages=msgs, max_tokens=3, temperature=0,
        extra_body={"add_generation_prompt": False, "continue_final_message": True})
    assert r.usage.prompt_tokens == len(open_ids)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=msgs, max_tokens=2,
                                       extra_body={"continue_final_message": True})


def test_non_json_body_is_415(server: str) -> None:
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/tokenize"):
        r = httpx.post(server + path, data={"prompt": PROMPT, "max_tokens": "2"}, timeout=30)
        assert r.status_code == 415, (path, r.text)
        assert r.json()["error"]["code"] == 415
    ok = httpx.post(server + "/v1/completions", timeout=30,
                    content=json.dumps({"prompt": PROMPT, "max_tokens": 1}),
                    headers={"content-type": "application/json; charset=utf-8"})
    assert ok.status_code == 200, ok.text


def test_logit_bias(client: Any, server: str) -> None:
    forced = httpx.post(server + "/tokenize", json={"prompt": " banana",
                                                    "add_special_tokens": False},
                        timeout=30).json()["tokens"][-1]
    r = client.completions.create(model="m", prompt=PROMPT, max_tokens=3, temperature=0,
                                  logit_bias={str(forced): 100},
                                  extra_body={"return_token_ids": True, "ignore_eos": True})
    assert r.choices[0].model_extra["token_ids"] == [forced] * 3
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=2, temperature=0.7, seed=1,
                                       logit_bias={str(forced): 100})
    assert r.choices[0].message.content.count("banana") == 2
    for bias in ({str(forced): 101}, {"-1": 1}, {"x": 1}, {"99999999": 1}):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="m", prompt=PROMPT, max_tokens=1, logit_bias=bias)
        assert "logit_bias" in e.value.body["message"]


def test_include_stop_str_in_output(client: Any) -> None:
    kw = dict(model="m", prompt="1, 2, 3, 4,", max_tokens=16, temperature=0)
    plain = client.completions.create(**kw)
    stop = plain.choices[0].text.strip()[:2]  # something the answer surely contains
    cut = client.completions.create(**kw, stop=[stop])
    kept = client.completions.create(**kw, stop=[stop],
                                     extra_body={"include_stop_str_in_output": True})
    assert cut.choices[0].finish_reason == kept.choices[0].finish_reason == "stop"
    assert kept.choices[0].text == cut.choices[0].text + stop
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        **kw, stop=[stop], stream=True, extra_body={"include_stop_str_in_output": True}))
    assert streamed == kept.choices[0].text
