"""The prompt's logprobs through the official `openai` client (one tiny-Llama server):
completions with echo + logprobs (plain, streaming, n=2, max_tokens 0), and vLLM's
`prompt_logprobs` on completions and chat, checked against transformers' log_softmax."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

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
