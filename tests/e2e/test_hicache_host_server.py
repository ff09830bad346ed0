"""The hierarchical cache's host tier over HTTP on a real `radixlm serve` (a tiny random
Llama): a 512-token device pool under write_back with a host tier of 2 x the pool; four
206-token prompts, then the same four again: the first ones were demoted to host memory
and load back from it (no file is written while the host tier keeps them),
usage.prompt_tokens_details.cached_tokens covers their whole 64-token blocks, and every
greedy output equals that of an engine without any cache."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.hicache_helpers import G, prompts, want  # noqa: F401 (want: a fixture)
from tests.server_harness import assert_pool_free, running_server

pytestmark = pytest.mark.slow


def _complete(url: str, ids: list[int]) -> dict:
    body = {"prompt": ids, "max_tokens": G.max_new_tokens, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_host_tier_over_http(tiny_llama_dir: str, tmp_path: Path, want) -> None:
    ps = prompts(4, seed=41)  # 4 x 206 tokens > the 512-slot pool
    with running_server(tiny_llama_dir, "--max-total-tokens", "512",
                        "--enable-hierarchical-cache", "--hicache-ratio", "2.0",
                        "--hicache-write-policy", "write_back",
                        "--hicache-storage-dir", str(tmp_path)) as srv:
        first = [_complete(srv.url, p) for p in ps]
        again = [_complete(srv.url, p) for p in ps]
        info = httpx.get(srv.url + "/server_info", timeout=30).json()["pool"]["hicache"]
        assert_pool_free(srv.url)
    cached = [o["usage"]["prompt_tokens_details"]["cached_tokens"] for o in again]
    assert cached == [192] * 4  # the 3 whole blocks of the 205 matched tokens
    assert info["host_capacity_tokens"] == 1024
    assert info["blocks_loaded_host"] > 0 and info["hit_tokens_host"] > 0
    assert info["hit_tokens_storage"] == 0 and info["storage_blocks"] == 0
    ids = [[o["choices"][0]["token_ids"] for o in outs] for outs in (first, again)]
    assert ids[0] == ids[1] == want(ps)
