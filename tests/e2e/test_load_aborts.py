"""Under load on the real server (tiny model): 100 streaming clients that hang up
mid-stream leave every KV slot free; a request whose deadline passes while it waits
behind a full batch gets a 408 and leaves nothing behind; the queue limit answers 429."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.conftest import make_tiny_llama
from tests.server_harness import assert_pool_free, running_server

pytestmark = pytest.mark.slow

CLIENTS = 100


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return make_tiny_llama(str(tmp_path_factory.mktemp("tiny_load")), max_pos=2048)


async def _hang_up_after(client: httpx.AsyncClient, url: str, i: int, events: int) -> int:
    body = {"prompt": f"w{i % 50} w{(7 * i) % 50} w3", "max_tokens": 1000, "ignore_eos": True,
            "stream": True, "temperature": 0.8, "seed": i}
    seen = 0
    async with client.stream("POST", url + "/v1/completions", json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                seen += 1
                if seen >= events:
                    break  # leaving the block closes the connection mid-stream
    return seen


def test_hundred_clients_hanging_up_mid_stream_free_every_slot(model: str) -> None:
    with running_server(model, "--max-total-tokens", "16384", "--max-running-requests", "32",
                        "--max-queued-requests", "200") as srv:
        async def main() -> list[int]:
            limits = httpx.Limits(max_connections=CLIENTS)
            async with httpx.AsyncClient(timeout=300, limits=limits) as client:
                return await asyncio.gather(*[_hang_up_after(client, srv.url, i, 2 + i % 5)
                                              for i in range(CLIENTS)])

        seen = asyncio.run(main())
        assert all(s >= 2 for s in seen)
        pool = assert_pool_free(srv.url)
        metrics = httpx.get(srv.url + "/metrics", timeout=30).text
        assert "radixlm_api_requests_in_flight" in metrics
        assert pool["free_kv_slots"] + pool["held_by_cache"] == pool["total_kv_slots"]


async def _in_flight(client: httpx.AsyncClient, url: str) -> float:
    text = (await client.get(url + "/metrics")).text
    line = next(x for x in text.splitlines() if x.startswith("radixlm_api_requests_in_flight"))
    return float(line.split()[-1])


def test_deadline_while_waiting_and_queue_limit(model: str) -> None:
    with running_server(model, "--max-total-tokens", "8192", "--max-running-requests", "1",
                        "--max-queued-requests", "1") as srv:
        long = {"prompt": "w3 w4", "max_tokens": 1500, "ignore_eos": True, "stream": True}

        async def main() -> tuple[httpx.Response, httpx.Response, list[str]]:
            async with httpx.AsyncClient(timeout=300) as client:
                async with client.stream("POST", srv.url + "/v1/completions",
                                         json=long) as resp:
                    lines = resp.aiter_lines()
                    while not (await lines.__anext__()).startswith("data: "):
                        pass  # the long request decodes: the one running slot is taken
                    waiter = asyncio.create_task(client.post(
                        srv.url + "/v1/completions",
                        json={"prompt": "w5", "max_tokens": 4, "timeout": 0.5}))
                    while await _in_flight(client, srv.url) < 2:  # it waits in the queue
                        await asyncio.sleep(0.02)
                    full = await client.post(srv.url + "/v1/completions",
                                             json={"prompt": "w6", "max_tokens": 1})
                    timed_out = await waiter
                    return timed_out, full, []

        timed_out, full, _ = asyncio.run(main())
        assert timed_out.status_code == 408, timed_out.text
        assert "timed out" in timed_out.json()["error"]["message"]
        assert full.status_code == 429 and full.headers["retry-after"] == "1", full.text
        assert json.loads(full.text)["error"]["type"] == "rate_limit_error"
        assert_pool_free(srv.url)
