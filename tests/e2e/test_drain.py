"""SIGTERM drains the server: a request in flight finishes, a new one is refused (503,
/health 503), the process exits 0 with no child left; past --shutdown-timeout the
request still running ends with a clear error instead. The same holds when SIGTERM or
SIGINT reaches the whole process group (systemd, Ctrl-C): the children leave it to the
API process.

The scheduler is paused (SIGSTOP) from just before the signal until the test has seen the
server draining and refusing: the request in flight cannot finish meanwhile, so the drain
cannot end (and the server exit) before the test looks, however loaded the machine is."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from tests.conftest import make_tiny_llama
from tests.process_tree import alive, comm
from tests.server_harness import running_server

pytestmark = pytest.mark.slow

LONG = 1500  # tokens: the stream is still decoding when SIGTERM arrives


@pytest.fixture(scope="module")
def long_ctx_model(tmp_path_factory) -> str:
    return make_tiny_llama(str(tmp_path_factory.mktemp("tiny_long")), max_pos=2048)


def _stream_lines(client: httpx.Client, url: str):
    body = {"prompt": "w3 w4", "max_tokens": LONG, "ignore_eos": True, "temperature": 0,
            "stream": True}
    return client.stream("POST", url + "/v1/completions", json=body, timeout=300)


def _events(lines) -> list:
    return [json.loads(x[6:]) if x != "data: [DONE]" else "[DONE]"
            for x in lines if x.startswith("data: ")]


def _exit_code(proc: subprocess.Popen, timeout_s: float = 120) -> int:
    return proc.wait(timeout=timeout_s)


def _wait_draining(url: str, timeout_s: float = 30.0) -> None:
    """Until /health answers 503: the server has taken the signal and is draining (the
    caller holds the scheduler paused, so the drain cannot have ended already)."""
    deadline = time.monotonic() + timeout_s
    while httpx.get(url + "/health", timeout=30).status_code != 503:
        assert time.monotonic() < deadline, "the server did not start draining"
        time.sleep(0.02)


@contextmanager
def _scheduler_paused(children: set[int]) -> Iterator[None]:
    """SIGSTOP the server's scheduler process (SIGCONT on the way out): no request makes
    progress meanwhile; the API process keeps answering."""
    (pid,) = [p for p in children if comm(p) == "radixlm-sched"]
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _survivors(children: set[int], wait_s: float = 15.0) -> list[int]:
    """Children still alive `wait_s` after the server exited (multiprocessing's resource
    tracker, say, leaves a moment after its parent)."""
    deadline = time.monotonic() + wait_s
    while any(alive(p) for p in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [p for p in children if alive(p)]


def test_sigterm_finishes_running_request_and_refuses_new(long_ctx_model: str) -> None:
    with running_server(long_ctx_model, "--max-total-tokens", "8192",
                        "--shutdown-timeout", "300") as srv:
        children = srv.children()
        with httpx.Client() as client, _stream_lines(client, srv.url) as resp:
            lines = resp.iter_lines()
            first = [next(lines) for _ in range(2)]  # decoding has started
            with _scheduler_paused(children):
                srv.proc.send_signal(signal.SIGTERM)
                _wait_draining(srv.url)  # the signal is handled on the server's loop
                refused = httpx.post(srv.url + "/v1/completions",
                                     json={"prompt": "w5", "max_tokens": 1}, timeout=30)
                health = httpx.get(srv.url + "/health", timeout=30)
            rest = list(lines)
        events = _events(first + rest)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == 503
        assert health.status_code == 503
        assert events[-1] == "[DONE]"
        assert not any("error" in e for e in events[:-1]), events[-3:]
        assert events[-2]["choices"][0]["finish_reason"] == "length"
        text_events = [e for e in events[:-1] if e["choices"]]
        assert len(text_events) >= 2
        assert _exit_code(srv.proc) == 0, srv.log_tail()
        assert not _survivors(children)


def test_sigterm_aborts_what_outlives_the_shutdown_timeout(long_ctx_model: str) -> None:
    with running_server(long_ctx_model, "--max-total-tokens", "8192",
                        "--shutdown-timeout", "0.5") as srv:
        children = srv.children()
        with httpx.Client() as client, _stream_lines(client, srv.url) as resp:
            lines = resp.iter_lines()
            first = [next(lines) for _ in range(2)]
            srv.proc.send_signal(signal.SIGTERM)
            events = _events(first + list(lines))
        assert events[-1] == "[DONE]"
        err = events[-2]["error"]
        assert err["code"] == 503 and "--shutdown-timeout" in err["message"], err
        assert _exit_code(srv.proc) == 0, srv.log_tail()
        assert not _survivors(children)


GROUP_TOKENS = 800  # still decoding while the test checks that new requests are refused


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_to_the_process_group_drains(long_ctx_model: str, sig: signal.Signals) -> None:
    """What systemd (KillMode=control-group) and Ctrl-C do: every process of the server
    gets the signal. The request in flight still gets all its tokens."""
    with running_server(long_ctx_model, "--max-total-tokens", "8192", "--shutdown-timeout",
                        "300", new_session=True) as srv:
        children = srv.children()
        assert children
        body = {"prompt": "w3 w4", "max_tokens": GROUP_TOKENS, "ignore_eos": True,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.Client() as client, client.stream("POST", srv.url + "/v1/completions",
                                                     json=body, timeout=300) as resp:
            lines = resp.iter_lines()
            first = [next(lines) for _ in range(2)]  # decoding has started
            with _scheduler_paused(children):
                os.killpg(srv.proc.pid, sig)
                _wait_draining(srv.url)
                refused = httpx.post(srv.url + "/v1/completions",
                                     json={"prompt": "w5", "max_tokens": 1}, timeout=30)
            rest = list(lines)
        events = _events(first + rest)
        assert refused.status_code == 503, refused.text
        assert events[-1] == "[DONE]"
        assert not any("error" in e for e in events[:-1]), events[-3:]
        assert events[-2]["usage"]["completion_tokens"] == GROUP_TOKENS
        assert events[-3]["choices"][0]["finish_reason"] == "length"
        assert _exit_code(srv.proc) == 0, srv.log_tail()
        assert not _survivors(children)


def test_second_ctrl_c_stops_at_once(long_ctx_model: str) -> None:
    """Ctrl-C twice (SIGINT to the group twice): the drain is cut short, the request in
    flight does not get its remaining tokens, and nothing is left behind."""
    with running_server(long_ctx_model, "--max-total-tokens", "8192", "--shutdown-timeout",
                        "300", new_session=True) as srv:
        children = srv.children()
        got: list[str] = []
        with httpx.Client() as client, _stream_lines(client, srv.url) as resp:
            lines = resp.iter_lines()
            got += [next(lines) for _ in range(2)]
            with _scheduler_paused(children):
                os.killpg(srv.proc.pid, signal.SIGINT)
                _wait_draining(srv.url)
            t0 = time.monotonic()
            os.killpg(srv.proc.pid, signal.SIGINT)
            try:
                got += list(lines)
            except httpx.HTTPError:
                pass  # the connection was dropped: what a stop at once does
        _exit_code(srv.proc, timeout_s=30)
        assert time.monotonic() - t0 < 30
        events = _events(got)
        finished = [e for e in events if isinstance(e, dict) and e.get("choices")
                    and e["choices"][0].get("finish_reason") == "length"]
        assert not finished, "the request ran to its end: the second SIGINT did not stop it"
        assert not _survivors(children)
