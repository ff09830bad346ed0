"""The hierarchical cache's storage tier over HTTP on a real `radixlm serve` (the default
model): a long prompt's K/V written to --hicache-storage-dir survives SIGTERM and a
restart on the same directory (the same prompt's usage.prompt_tokens_details.
cached_tokens covers the stored blocks, the greedy output is identical), and
`POST /flush_cache?storage=true` empties the directory (the next request gets no hit)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.conftest import requires_default_model
from tests.server_harness import assert_pool_free, running_server

pytestmark = [pytest.mark.slow, requires_default_model]

BLOCK = 64  # storage block tokens (page size 1)
PROMPT = " ".join(f"Record {i}: the {w} sensor read {i * 37 % 101} units at dawn."
                  for i, w in enumerate(["north", "south", "east", "west"] * 10))


def _complete(url: str) -> dict:
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    r = httpx.post(url + "/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def _cached(out: dict) -> int:
    return out["usage"]["prompt_tokens_details"]["cached_tokens"]


def _files(d: Path) -> list[Path]:
    return sorted(d.glob("*/*.kv"))


def _serve(storage: Path):
    return running_server(None, "--max-total-tokens", "4096", "--max-running-requests", "4",
                          "--enable-hierarchical-cache", "--hicache-storage-backend", "file",
                          "--hicache-storage-dir", str(storage))


def test_restart_serves_stored_blocks_and_flush_empties_them(tmp_path):
    with _serve(tmp_path) as srv:
        first = _complete(srv.url)
        assert _cached(first) == 0
        assert_pool_free(srv.url)
    prompt_tokens = first["usage"]["prompt_tokens"]
    assert prompt_tokens > 4 * BLOCK, prompt_tokens  # a long prompt: several blocks
    stored = len(_files(tmp_path))  # SIGTERM let the writer finish: the files are there
    whole = (prompt_tokens - 1) // BLOCK  # the last prompt token is always computed
    assert stored >= whole
    with _serve(tmp_path) as srv:
        again = _complete(srv.url)
        assert _cached(again) == whole * BLOCK
        assert again["choices"][0]["text"] == first["choices"][0]["text"]
        info = httpx.get(srv.url + "/server_info", timeout=30).json()["pool"]["hicache"]
        assert info["hit_tokens_storage"] == whole * BLOCK and info["blocks_loaded"] == whole
        assert_pool_free(srv.url)
        r = httpx.post(srv.url + "/flush_cache?storage=true", timeout=60)
        assert r.status_code == 200, r.text
        assert _files(tmp_path) == []
        cold = _complete(srv.url)
        assert _cached(cold) == 0
        assert cold["choices"][0]["text"] == first["choices"][0]["text"]
        assert_pool_free(srv.url)
