"""Client disconnects abort the request: the app under a real uvicorn (in a thread), a real
TokenizerManager and ZMQ, and the FakeEngine producing one token every 20 ms."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from tests.server_fakes import FakeStack, fake_stack


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[FakeStack, str]]:
    with fake_stack(context_len=1024, token_delay=0.02) as stack:
        port = _free_port()
        server = uvicorn.Server(uvicorn.Config(stack.app, host="127.0.0.1", port=port,
                                               log_level="warning", lifespan="on"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.started
        try:
            yield stack, f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True
            thread.join(10)


def _still_serves(url: str) -> None:
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "hello", "max_tokens": 2}, timeout=10)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "hello", "max_tokens": 500, "stream": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 500, "stream": True, "n": 2}),
    ("/generate", {"text": "hello", "stream": True, "sampling_params": {"max_new_tokens": 500}}),
])
def test_closing_a_stream_aborts(served: tuple[FakeStack, str], path: str, body: dict) -> None:
    stack, url = served
    n = body.get("n", 1)
    before = len(stack.engine.aborted)
    with httpx.stream("POST", url + path, json=body, timeout=10) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [next(lines) for _ in range(4)]
        assert any(line.startswith("data: {") for line in got)
    assert stack.engine.wait_aborted(before + n)
    time.sleep(0.1)
    assert len(stack.engine.aborted) == before + n  # exactly once per request
    assert stack.tokenizer_manager.num_running == 0
    _still_serves(url)


def test_non_stream_client_timeout_aborts(served: tuple[FakeStack, str]) -> None:
    stack, url = served
    before = len(stack.engine.aborted)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/completions", json={"prompt": "hello", "max_tokens": 500, "n": 2},
                   timeout=0.3)
    assert stack.engine.wait_aborted(before + 2)
    assert stack.tokenizer_manager.num_running == 0
    _still_serves(url)
