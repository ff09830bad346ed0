"""`radixlm serve --enable-torch-compile` serves at once and compiles its decode graphs in
the background (executor/decode_graph_runner.py): healthy before any graph is ready, the
official `openai` client answered while they compile (eager steps) and after (graphs),
the same greedy text both times, /server_info reporting the graphs' progress, every KV
slot back; and a server stopped mid-compile by SIGTERM exits with its whole process tree
(inductor's compile workers included)."""

from __future__ import annotations

import time

import httpx
import pytest

from radixlm.cpu_kernels.ops import decode_attention_available
from tests.server_harness import assert_pool_free, running_server

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not decode_attention_available(),
                                 reason="compiled decode needs the C++ CPU decode kernel (g++)")]

# One graph (batch size 1): the requests below come one at a time.
FLAGS = ("--max-total-tokens", "1024", "--max-running-requests", "4",
         "--enable-torch-compile", "--torch-compile-max-bs", "1")


def graphs(url: str) -> dict:
    return httpx.get(url + "/server_info", timeout=30).json()["pool"]["decode_graphs"]


def complete(client, prompt: str) -> str:
    model = client.models.list().data[0].id
    r = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0)
    return r.choices[0].text


def test_serves_while_compiling_then_from_the_graphs(tiny_llama_dir: str) -> None:
    with running_server(tiny_llama_dir, *FLAGS) as srv:
        first = graphs(srv.url)
        assert first["batch_sizes"] == [1] and first["ready"] == [], first
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
        prompts = ["w3 w4 w5", "w7 w8 w9 w10"]
        early = [complete(client, p) for p in prompts]
        deadline = time.monotonic() + 300
        while (g := graphs(srv.url))["capturing"]:
            assert time.monotonic() < deadline, g
            time.sleep(0.5)
        assert g["ready"] == [1] and g["error"] is None, g
        replays = g["replays"]
        assert [complete(client, p) for p in prompts] == early
        assert graphs(srv.url)["replays"] > replays
        assert_pool_free(srv.url)


def test_sigterm_while_compiling_leaves_no_process(tiny_llama_dir: str) -> None:
    # running_server's exit sends SIGTERM and asserts the tree is gone, workers included
    with running_server(tiny_llama_dir, *FLAGS) as srv:
        assert graphs(srv.url)["capturing"]
        r = httpx.post(srv.url + "/generate", json={
            "input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4, "temperature": 0}},
            timeout=60)
        assert r.status_code == 200, r.text
