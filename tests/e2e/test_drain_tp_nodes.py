"""Multi-node tensor parallelism drains too: two "nodes" on localhost (`--tp-size 2
--nnodes 2`, node 1 running only its scheduler rank). SIGTERM or SIGINT to node 1's
process group while a request streams does not kill its rank (the stream goes on);
a signal to node 0's group then drains: the request gets all its tokens, node 0
exits 0, node 1 exits 0 once rank 0 tells it to stop, and no process of either is left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import httpx
import pytest

from tests.conftest import make_tiny_llama
from tests.process_tree import alive, descendants, free_port
from tests.server_harness import running_server

pytestmark = pytest.mark.slow

TOKENS = 400


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return make_tiny_llama(str(tmp_path_factory.mktemp("tiny_tp")), max_pos=1024)


def _events(lines: list[str]) -> list:
    return [json.loads(x[6:]) if x != "data: [DONE]" else "[DONE]"
            for x in lines if x.startswith("data: ")]


def test_follower_node_leaves_the_drain_to_node0(model: str) -> None:
    """Ctrl-C (SIGINT) reaches node 1's group, then systemd's SIGTERM node 0's: both signals
    meet real process trees in one run (the handlers of each are unit-tested,
    tests/unit/test_follower_signals.py)."""
    addr = f"127.0.0.1:{free_port()}"
    tp = ["--tp-size", "2", "--nnodes", "2", "--dist-init-addr", addr, "--device", "cpu",
          "--num-threads", "1", "--max-total-tokens", "2048"]
    log = tempfile.NamedTemporaryFile("w+", prefix="radixlm-node1-", suffix=".log")
    node1 = subprocess.Popen([sys.executable, "-m", "radixlm", "serve", "--model", model,
                              *tp, "--node-rank", "1"], stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    ranks: set[int] = set()
    try:
        with running_server(model, *tp, "--node-rank", "0", "--shutdown-timeout", "300",
                            new_session=True) as srv:
            ranks = descendants(node1.pid)
            assert ranks, "node 1 runs its rank as a child process"
            node0 = srv.children()
            body = {"prompt": "w3 w4", "max_tokens": TOKENS, "ignore_eos": True,
                    "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
            with httpx.Client() as client, client.stream(
                    "POST", srv.url + "/v1/completions", json=body, timeout=300) as resp:
                lines = resp.iter_lines()
                got = [next(lines) for _ in range(2)]  # decoding has started
                os.killpg(node1.pid, signal.SIGINT)
                got += [next(lines) for _ in range(4)]  # rank 1 still computes with rank 0
                assert node1.poll() is None and all(alive(p) for p in ranks)
                os.killpg(srv.proc.pid, signal.SIGTERM)
                got += list(lines)
            events = _events(got)
            assert events[-1] == "[DONE]"
            assert not any("error" in e for e in events[:-1]), events[-3:]
            assert events[-2]["usage"]["completion_tokens"] == TOKENS
            assert events[-3]["choices"][0]["finish_reason"] == "length"
            assert srv.proc.wait(timeout=120) == 0, srv.log_tail()
            rc = node1.wait(timeout=60)
            log.seek(0)
            assert rc == 0, log.read()[-4000:]
            deadline = time.monotonic() + 15  # a resource tracker leaves a moment later
            while any(alive(p) for p in ranks | node0) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not [p for p in ranks | node0 if alive(p)]
    finally:
        if node1.poll() is None:
            os.killpg(node1.pid, signal.SIGKILL)
            node1.wait()
        log.close()
