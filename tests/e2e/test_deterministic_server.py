"""`radixlm serve --enable-deterministic-inference` over HTTP, as users run it (tiny random
Llama, two servers started side by side: prefill chunks of 8 and of 512 tokens). Three
modes, each greedy and seeded: *single* (one prompt sent 1..4 times at once), *mixed* (the
prompt among other prompts of other lengths, shuffled, at once), *prefix* (prompts sharing
prefixes of several lengths, cache flushed and warm, on both chunk sizes). Every mode must
give exactly one unique output: the same tokens and bitwise-equal logprobs (chosen and
top-5)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from radixlm.bench.server_proc import LaunchedServer, radixlm_spec
from tests.server_harness import started_together

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0.0}
SEEDED = {"temperature": 0.9, "top_p": 0.9, "seed": 1234}
RNG = random.Random(0)
PROMPT = [RNG.randrange(3, 256) for _ in range(40)]
OTHERS = [[RNG.randrange(3, 256) for _ in range(RNG.randrange(3, 70))] for _ in range(6)]


@pytest.fixture(scope="module")
def servers(tiny_llama_dir: str) -> Iterator[list[str]]:
    args = dict(enable_deterministic_inference=True, max_total_tokens=4096,
                max_running_requests=16)
    with started_together(LaunchedServer(radixlm_spec("det-chunk8", tiny_llama_dir, {
            **args, "chunked_prefill_size": 8, "max_prefill_tokens": 8}), timeout_s=300),
            LaunchedServer(radixlm_spec("det-chunk512", tiny_llama_dir, {
                **args, "chunked_prefill_size": 512}), timeout_s=300)) as (a, b):
        yield [a.spec.base_url, b.spec.base_url]


def _complete(url: str, prompt: list[int], sampling: dict[str, Any]) -> str:
    body = {"model": "m", "prompt": prompt, "max_tokens": 6, "logprobs": 5, **sampling}
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    (choice,) = r.json()["choices"]
    # JSON floats round-trip exactly, so equal strings mean bitwise-equal logprobs.
    return json.dumps([choice["text"], choice["logprobs"]], sort_keys=True)


def _at_once(url: str, prompts: list[list[int]], sampling: dict[str, Any]) -> list[str]:
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p: _complete(url, p, sampling), prompts))


def _flush(url: str) -> None:
    assert httpx.post(url + "/flush_cache", timeout=60).status_code == 200


def _check_pools(url: str) -> None:
    pool = httpx.get(url + "/server_info", timeout=30).json()["pool"]
    assert pool["invariant_error"] is None and pool["held_by_requests"] == 0, pool


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_single(servers: list[str], sampling: dict[str, Any]) -> None:
    url = servers[1]
    outs = []
    for n in range(1, 5):
        _flush(url)
        outs += _at_once(url, [PROMPT] * n, sampling)
    assert len(set(outs)) == 1
    _check_pools(url)


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_mixed(servers: list[str], sampling: dict[str, Any]) -> None:
    url = servers[1]
    rng = random.Random(1)
    outs = []
    for _ in range(3):
        _flush(url)
        batch = [PROMPT] + rng.sample(OTHERS, rng.randrange(1, len(OTHERS)))
        rng.shuffle(batch)
        outs += [o for p, o in zip(batch, _at_once(url, batch, sampling)) if p is PROMPT]
    assert len(set(outs)) == 1
    _check_pools(url)


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_prefix(servers: list[str], sampling: dict[str, Any]) -> None:
    outs = []
    for url in servers:  # prefill chunks of 8 and of 512 tokens
        _flush(url)
        outs.append(_complete(url, PROMPT, sampling))  # cold
        outs.append(_complete(url, PROMPT, sampling))  # warm: all but its last token cached
        for shared in (5, 17, 33):
            _flush(url)
            _complete(url, PROMPT[:shared] + [7, 8, 9], sampling)
            outs += _at_once(url, [PROMPT, PROMPT[:shared] + [10, 11]], sampling)[:1]
        _check_pools(url)
    assert len(set(outs)) == 1
