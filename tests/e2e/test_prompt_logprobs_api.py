"""The prompt's logprobs through the official `openai` client (one tiny-Llama server):
completions with echo + logprobs (plain, streaming, n=2, max_tokens 0), and vLLM's
`prompt_logprobs` on completions and chat, checked against transformers' log_softmax; and
SGLang's `/generate` input_token_logprobs with logprob_start_len over raw HTTP, checked
against the completions endpoint's prompt logprobs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch

from tests.server_harness import running_server

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("pool_invariant")]
openai = pytest.importorskip("openai")

PROMPT = "w5 w17 w3 w40 w9 w21 w7 w11"


@pytest.fixture(scope="module")
def server(tiny_llama_dir: str) -> Iterator[str]:
    # Chunks smaller than the chat prompt: the logprobs are gathered across chunks.
    with running_server(tiny_llama_dir, "--max-total-tokens", "2048",
                        "--chunked-prefill-size", "8", "--dtype", "float32") as srv:
        yield srv.url


@pytest.fixture(scope="module")
def hf(tiny_llama_dir: str) -> Any:
    from transformers import AutoTokenizer, LlamaForCausalLM
    return (AutoTokenizer.from_pretrained(tiny_llama_dir),
            LlamaForCausalLM.from_pretrained(tiny_llama_dir, torch_dtype=torch.float32).eval())


def _want(hf: Any, ids: list[int]) -> list[float]:
    with torch.no_grad():
        lp = torch.log_softmax(hf[1](torch.tensor([ids])).logits[0].float(), dim=-1)
    return lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].tolist()


def test_echo_with_logprobs(client: Any, hf: Any) -> None:
    ids = hf[0](PROMPT)["input_ids"]
    r = client.completions.create(model="m", prompt=PROMPT, max_tokens=3, temperature=0,
                                  echo=True, logprobs=2, n=2)
    assert len(r.choices) == 2
    for ch in r.choices:
        lp = ch.logprobs
        assert ch.text.startswith(PROMPT)
        assert len(lp.tokens) == len(ids) + 3
        assert lp.tokens[:len(ids)] == [hf[0].decode([t]) for t in ids]
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert lp.token_logprobs[1:len(ids)] == pytest.approx(_want(hf, ids), abs=2e-3)
        assert all(len(t) >= 2 for t in lp.top_logprobs[1:])
        assert lp.text_offset[0] == 0 and lp.text_offset[len(ids)] == len(PROMPT)
    assert r.choices[0].logprobs.tokens == r.choices[1].logprobs.tokens
    chunks = list(client.completions.create(model="m", prompt=PROMPT, max_tokens=3,
                                            temperature=0, echo=True, logprobs=2, stream=True))
    text = "".join(c.choices[0].text for c in chunks)
    tokens = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    lps = [v for c in chunks if c.choices[0].logprobs
           for v in c.choices[0].logprobs.token_logprobs]
    assert text == r.choices[0].text
    assert tokens == r.choices[0].logprobs.tokens
    assert lps[0] is None and lps[1:] == pytest.approx(r.choices[0].logprobs.token_logprobs[1:])
    # Scoring a text (lm-eval's loglikelihood): max_tokens 0 still computes the prompt's.
    only = client.completions.create(model="m", prompt=PROMPT, max_tokens=0, echo=True,
                                     logprobs=0)
    assert only.choices[0].text == PROMPT
    assert only.choices[0].logprobs.token_logprobs[1:] == pytest.approx(_want(hf, ids), abs=2e-3)


def test_prompt_logprobs_field(client: Any, hf: Any) -> None:
    ids = hf[0](PROMPT)["input_ids"]
    r = client.completions.create(model="m", prompt=PROMPT, max_tokens=2, temperature=0,
                                  extra_body={"prompt_logprobs": 1})
    pl = r.choices[0].model_extra["prompt_logprobs"]
    assert pl[0] is None and len(pl) == len(ids)
    assert [e[str(t)]["logprob"] for e, t in zip(pl[1:], ids[1:])] == \
        pytest.approx(_want(hf, ids), abs=2e-3)
    assert all(1 <= len(e) <= 2 and any(v["rank"] == 1 for v in e.values()) for e in pl[1:])
    assert r.choices[0].logprobs is None
    msgs = [{"role": "user", "content": PROMPT}]
    chat = client.chat.completions.create(model="m", messages=msgs, max_tokens=2,
                                          temperature=0, extra_body={"prompt_logprobs": 0})
    text = hf[0].apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    chat_ids = hf[0](text, add_special_tokens=False)["input_ids"]
    cpl = chat.model_extra["prompt_logprobs"]
    assert cpl[0] is None and len(cpl) == len(chat_ids) > 8
    assert [e[str(t)]["logprob"] for e, t in zip(cpl[1:], chat_ids[1:])] == \
        pytest.approx(_want(hf, chat_ids), abs=2e-3)
    with pytest.raises(openai.BadRequestError, match="prompt_logprobs"):
        client.chat.completions.create(model="m", messages=msgs, max_tokens=2, stream=True,
                                       extra_body={"prompt_logprobs": 0})


def _generate(server: str, ids: list[int], **extra: Any) -> httpx.Response:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 2, "temperature": 0},
            "return_logprob": True, **extra}
    return httpx.post(server + "/generate", json=body, timeout=120)


def test_generate_input_token_logprobs(server: str, client: Any, hf: Any) -> None:
    ids = hf[0](PROMPT)["input_ids"]
    text = [hf[0].decode([t]) for t in ids]
    ref = client.completions.create(model="m", prompt=ids, max_tokens=2, temperature=0,
                                    extra_body={"prompt_logprobs": 2})
    want = [e[str(t)]["logprob"] for e, t in
            zip(ref.choices[0].model_extra["prompt_logprobs"][1:], ids[1:])]
    for start in (0, 3, len(ids) - 2):
        meta = _generate(server, ids, logprob_start_len=start, top_logprobs_num=2).json()
        meta = meta["meta_info"]
        got, tops = meta["input_token_logprobs"], meta["input_top_logprobs"]
        assert [e[1] for e in got] == ids[start:]
        assert [e[2] for e in got] == text[start:]
        assert got[0][0] is None and tops[0] is None  # SGLang pads the first token
        assert [e[0] for e in got[1:]] == pytest.approx(want[start:], abs=1e-5)
        assert len(tops) == len(got)
        for top, (lp, tok, _) in zip(tops[1:], got[1:]):
            vals = [v for v, _, _ in top]
            assert len(top) == 2 and vals == sorted(vals, reverse=True)
            assert vals[0] >= lp - 1e-5
        assert len(meta["output_token_logprobs"]) == 2
    # SGLang's default (-1): the last prompt token only, with no logprob; no text asked.
    meta = _generate(server, ids, return_text_in_logprobs=False).json()["meta_info"]
    assert meta["input_token_logprobs"] == [[None, ids[-1], None]]
    assert meta["input_top_logprobs"] == [None]
    assert all(e[2] is None for e in meta["output_token_logprobs"])
    # Streaming: every event carries them (complete from the first).
    with httpx.stream("POST", server + "/generate", timeout=120, json={
            "input_ids": ids, "stream": True, "return_logprob": True, "logprob_start_len": 1,
            "sampling_params": {"max_new_tokens": 3, "temperature": 0}}) as r:
        events = [line for line in r.iter_lines() if line.startswith("data: {")]
    last = json.loads(events[-1][len("data: "):])["meta_info"]
    assert [e[0] for e in last["input_token_logprobs"][1:]] == pytest.approx(want[1:], abs=1e-5)
    for bad in (len(ids), len(ids) + 5, -2):
        r = _generate(server, ids, logprob_start_len=bad)
        assert r.status_code == 400 and "logprob_start_len" in r.text, (bad, r.text)
