"""`radixlm serve --speculative-algorithm NGRAM` through the official `openai` client.

Two servers on the default model (float32), started side by side: one with NGRAM
speculation, one without (the reference; only its answers are used). On a copy-heavy
prompt (rename a function in a code snippet): greedy chat and completion outputs equal the
reference's, token logprobs too; a stream delivers several tokens in one chunk and its
text adds up to the whole answer; `n` = 3 greedy choices all equal the reference and
seeded sampled choices come back complete; the server accepted drafts (`/server_info`),
and the pool is whole after every test.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import requires_default_model
from tests.server_harness import running_server, started_together

pytestmark = [pytest.mark.slow, requires_default_model,
              pytest.mark.usefixtures("pool_invariant")]

openai = pytest.importorskip("openai")

FLAGS = ("--dtype", "float32", "--max-total-tokens", "4096", "--max-running-requests", "8")
CODE = '''def fibonacci(n):
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
    a, b = 0, 1
    for _ in range(n - 1):
        a, b = b, a + b
    return b
'''
CHAT = [{"role": "user",
         "content": "Rename the function fibonacci to fib and output the whole code:\n" + CODE}]
PROMPT = "Here is a function.\n" + CODE + "\nThe same function, copied exactly:\n"
MAX = 80


def _chat(client: Any, model: str, **kw) -> Any:
    return client.chat.completions.create(model=model, messages=CHAT, max_tokens=MAX,
                                          temperature=0, **kw)


def _complete(client: Any, model: str, **kw) -> Any:
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", MAX)
    return client.completions.create(model=model, prompt=PROMPT, **kw)


def _client(url: str) -> Any:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=300, max_retries=0)


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[str, str]]:
    """(reference, speculative): started side by side (their start-ups overlap)."""
    with started_together(running_server(None, *FLAGS),
                          running_server(None, *FLAGS, "--speculative-algorithm", "NGRAM")
                          ) as (ref, spec):
        yield ref.url, spec.url


@pytest.fixture(scope="module")
def reference(servers: tuple[str, str]) -> dict[str, Any]:
    """The answers of the server without speculation."""
    client = _client(servers[0])
    (m,) = client.models.list().data
    comp = _complete(client, m.id, logprobs=2)
    return {"chat": _chat(client, m.id).choices[0].message.content,
            "text": comp.choices[0].text,
            "tokens": comp.choices[0].logprobs.tokens,
            "logprobs": comp.choices[0].logprobs.token_logprobs}


@pytest.fixture(scope="module")
def server(servers: tuple[str, str], reference: dict[str, Any]) -> str:
    return servers[1]


@pytest.fixture(scope="module")
def model(client: Any) -> str:
    (m,) = client.models.list().data
    return m.id


def _accepted(url: str) -> int:
    return httpx.get(url + "/server_info", timeout=30).json()["pool"]["speculative"]["accepted"]


def test_greedy_chat_equals_no_speculation(client, model, server, reference):
    before = _accepted(server)
    assert _chat(client, model).choices[0].message.content == reference["chat"]
    assert _accepted(server) > before  # the copy was drafted and accepted


def test_completion_logprobs_are_the_targets(client, model, reference):
    choice = _complete(client, model, logprobs=2).choices[0]
    assert choice.text == reference["text"]
    assert choice.logprobs.tokens == reference["tokens"]
    assert choice.logprobs.token_logprobs == pytest.approx(reference["logprobs"], abs=1e-3)


def test_stream_carries_several_tokens_per_chunk(client, model, reference):
    chunks = [c for c in _complete(client, model, logprobs=1, stream=True)
              if c.choices and c.choices[0].text]
    assert "".join(c.choices[0].text for c in chunks) == reference["text"]
    per_chunk = [len(c.choices[0].logprobs.tokens) for c in chunks]
    assert sum(per_chunk) == len(reference["tokens"])
    assert max(per_chunk) > 1, per_chunk


def test_n_choices(client, model, reference):
    r = _complete(client, model, n=3)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert [c.text for c in r.choices] == [reference["text"]] * 3
    sampled = _complete(client, model, n=2, temperature=0.8, seed=5, max_tokens=24)
    assert len(sampled.choices) == 2
    assert all(c.finish_reason in ("length", "stop") and c.text for c in sampled.choices)
    assert sampled.usage.completion_tokens <= 48
