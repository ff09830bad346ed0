"""`radixlm serve` on the real Gemma 3 270M GGUF, driven by the official `openai` client:
a greedy completion equal to the offline engine's, streaming, chat through the Gemma
chat template (the base GGUF ships none: tokenizer/family_templates.py), and the pool
invariant after every test."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import gemma3_270m_path, requires_gemma3_270m
from tests.process_tree import descendants, free_port, terminate_tree, wait_healthy

pytestmark = [pytest.mark.slow, requires_gemma3_270m]

openai = pytest.importorskip("openai")

STARTUP_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    port = free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="radixlm-gemma3-", suffix=".log",
                                      delete=False)
    cmd = [sys.executable, "-m", "radixlm", "serve", "--model", gemma3_270m_path(),
           "--port", str(port), "--max-total-tokens", "4096", "--max-running-requests", "4",
           "--dtype", "float32"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    started: set[int] = set()

    def log_tail() -> str:
        log.flush()
        with open(log.name) as f:
            return f.read()[-4000:]

    try:
        wait_healthy(proc, url, STARTUP_TIMEOUT_S, log_tail, poll_s=0.5)
        started = descendants(proc.pid)
        yield url
    finally:
        if proc.poll() is None:
            started = descendants(proc.pid)
        obeyed, orphans = terminate_tree(proc, started)
        if not obeyed:
            pytest.fail(f"server ignored SIGTERM:\n{log_tail()}")
        log.close()
        os.unlink(log.name)
        assert not orphans, f"child processes left after SIGTERM: {orphans}"


@pytest.fixture(scope="module")
def client(server: str) -> Any:
    return openai.OpenAI(base_url=server + "/v1", api_key="x", timeout=120, max_retries=0)


@pytest.fixture(autouse=True)
def pool_invariant(server: str) -> Iterator[None]:
    yield
    deadline = time.monotonic() + 30
    while True:
        pool = httpx.get(server + "/server_info", timeout=30).json()["pool"]
        if pool["running"] == 0 and pool["waiting"] == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert pool["invariant_error"] is None, pool
    assert pool["held_by_requests"] == 0, pool
    assert pool["free_kv_slots"] + pool["held_by_cache"] == pool["total_kv_slots"], pool


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
