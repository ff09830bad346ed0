"""The real server with --int4-int8-activations, met as a user meets it: the flag reaches
the model's linear methods (in a float32 run on an AVX2 CPU the int4 layers keep no dense
float32 copy: the memory plan's weights say so beside the default server's), the official
`openai` client gets answers, streamed equal to unstreamed, and requests arriving together
decode as they do alone (x is quantized per row: a row's result does not depend on its
batch)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.conftest import requires_default_model
from tests.server_harness import running_server

pytestmark = [pytest.mark.slow, requires_default_model,
              pytest.mark.usefixtures("pool_invariant")]

PROMPTS = ["The capital of France is", "Write a haiku about the sea.",
           "List three prime numbers:", "What is 2 + 2?", "Name a colour.",
           "Translate 'good morning' to Spanish.", "Why is the sky blue?", "Count to five:"]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_server(None, "--max-total-tokens", "4096", "--max-running-requests", "8",
                        "--int4-int8-activations") as srv:
        yield srv.url


def server_info(url: str) -> dict[str, Any]:
    r = httpx.get(url + "/get_server_info", timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_flag_reaches_the_linear_methods(server: str, default_server: str) -> None:
    info = server_info(server)
    assert info["server_args"]["int4_int8_activations"] is True
    formats = info["memory_plan"]["weight_formats"]
    assert formats.get("int4 groupwise", 0) > 0, formats
    default_formats = server_info(default_server)["memory_plan"]["weight_formats"]
    if info["dtype"]["resolved"] == "float32" and groups_f32_here():
        # The default keeps a dense float32 copy for large calls; the flag runs every call
        # of the int4 layers on the int8-activation kernel and keeps none.
        assert any("fallback" in k for k in default_formats), default_formats
        assert not any("fallback" in k for k in formats), formats
        assert sum(formats.values()) < sum(default_formats.values()) / 2


def groups_f32_here() -> bool:
    from radixlm.models.linear.groups_f32 import groups_f32_usable

    return groups_f32_usable()


def chat(client: Any, prompt: str, **kw: Any) -> Any:
    return client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": prompt}], max_tokens=24,
        temperature=0, seed=0, **kw)


def test_openai_client_unary_and_streamed(client: Any) -> None:
    r = chat(client, PROMPTS[0])
    text = r.choices[0].message.content
    assert text and r.choices[0].finish_reason in ("stop", "length")
    assert 0 < r.usage.completion_tokens <= 24
    chunks = list(chat(client, PROMPTS[0], stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text


def test_requests_arriving_together_decode_as_alone(client: Any) -> None:
    alone = [chat(client, p).choices[0].message.content for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: chat(client, p).choices[0].message.content,
                                 PROMPTS))
    assert together == alone
