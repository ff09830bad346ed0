"""`radixlm serve` on the real Gemma 3 270M GGUF, driven by the official `openai` client:
a greedy completion equal to the offline engine's, streaming, chat through the Gemma
chat template (the base GGUF ships none: tokenizer/family_templates.py), and the pool
invariant after every test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import gemma3_270m_path, requires_gemma3_270m
from tests.server_harness import running_server

pytestmark = [pytest.mark.slow, requires_gemma3_270m,
              pytest.mark.usefixtures("pool_invariant")]

openai = pytest.importorskip("openai")

STARTUP_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_server(gemma3_270m_path(), "--max-total-tokens", "4096",
                        "--max-running-requests", "4", "--dtype", "float32",
                        startup_s=STARTUP_TIMEOUT_S) as srv:
        yield srv.url

@pytest.fixture(scope="module")
def model(client: Any) -> str:
    (m,) = client.models.list().data
    return m.id


def test_greedy_completion_is_coherent_and_streams_the_same(client: Any, model: str) -> None:
    kw = dict(model=model, prompt="The capital of France is", max_tokens=12, temperature=0)
    full = client.completions.create(**kw)
    text = full.choices[0].text
    # The offline engine, same model and dtype, gives the same greedy tokens.
    from radixlm import Engine, SamplingParams

    offline = Engine(model=gemma3_270m_path(), dtype="float32", max_total_tokens=1024)
    want = offline.generate(kw["prompt"], SamplingParams(max_new_tokens=12, temperature=0))
    assert text == want["text"], (text, want["text"])
    assert "Paris" in text or "France" in text, text
    assert full.usage.prompt_tokens == 6 and full.usage.completion_tokens == 12
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True)
                       if c.choices)
    assert streamed == text


def test_chat_uses_the_gemma_template(client: Any, model: str) -> None:
    out = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8,
        temperature=0)
    # <bos><start_of_turn>user\nSay hello.<end_of_turn>\n<start_of_turn>model\n
    assert out.usage.prompt_tokens == 12
    assert out.choices[0].finish_reason in ("stop", "length")
