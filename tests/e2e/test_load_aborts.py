"""Under load on the real server (tiny model): 100 streaming clients that hang up
mid-stream leave every KV slot free; a request whose deadline (its own or the server's
--request-timeout) passes while it waits behind a full batch gets a 408 and leaves
nothing behind; the queue limit answers 429."""

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


async def _until_in_flight(client: httpx.AsyncClient, url: str, n: int) -> None:
    for _ in range(3000):  # 60 s: a clear failure instead of a hang
        if await _in_flight(client, url) >= n:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"never {n} requests in flight")


def test_deadline_while_waiting_and_queue_limit(model: str) -> None:
    """One running slot held by a long stream (its own `timeout` overrides the server's
    --request-timeout 1). Behind it, one request with `timeout` 0.5 and one without (the
    server-wide 1 s applies) both end with 408 while the long one still streams. Then two
    requests without deadlines fill the queue and the next one gets 429. No step depends
    on a deadline not passing before the client looks."""
    with running_server(model, "--max-total-tokens", "8192", "--max-running-requests", "1",
                        "--max-queued-requests", "2", "--request-timeout", "1") as srv:
        long = {"prompt": "w3 w4", "max_tokens": 2000, "ignore_eos": True, "stream": True,
                "timeout": 600}
        quiet = {"prompt": "w5", "max_tokens": 4, "timeout": 600}

        async def main() -> tuple[list[httpx.Response], httpx.Response, list[httpx.Response]]:
            async with httpx.AsyncClient(timeout=300) as client:
                async with client.stream("POST", srv.url + "/v1/completions",
                                         json=long) as resp:
                    lines = resp.aiter_lines()
                    while not (await lines.__anext__()).startswith("data: "):
                        pass  # the long request decodes: the one running slot is taken
                    timed_out = await asyncio.gather(
                        client.post(srv.url + "/v1/completions",
                                    json={"prompt": "w5", "max_tokens": 4, "timeout": 0.5}),
                        client.post(srv.url + "/v1/completions",
                                    json={"prompt": "w7", "max_tokens": 4}))
                    # Still streaming: the two never left the queue.
                    assert (await lines.__anext__()) is not None
                    queued = [asyncio.create_task(client.post(srv.url + "/v1/completions",
                                                              json=quiet)) for _ in range(2)]
                    await _until_in_flight(client, srv.url, 3)
                    full = await client.post(srv.url + "/v1/completions",
                                             json={"prompt": "w6", "max_tokens": 1})
                # The long stream is closed (aborted): the queued two run.
                return timed_out, full, list(await asyncio.gather(*queued))

        timed_out, full, served = asyncio.run(main())
        for r in timed_out:
            assert r.status_code == 408, r.text
            assert "timed out" in r.json()["error"]["message"]
        assert "after 0.5 s" in timed_out[0].json()["error"]["message"]
        assert "after 1 s" in timed_out[1].json()["error"]["message"]  # --request-timeout
        assert full.status_code == 429 and full.headers["retry-after"] == "1", full.text
        assert json.loads(full.text)["error"]["type"] == "rate_limit_error"
        assert [r.status_code for r in served] == [200, 200]
        assert_pool_free(srv.url)
