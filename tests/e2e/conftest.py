"""Fixtures shared by the e2e modules: `default_server`, one default-model server for the
whole session (the modules that need no flags of their own share it instead of starting
one each), the official `openai` client on a module's `server` (the URL), and the pool
check after every test.

Invariant for the modules on `default_server`: no test depends on another module's
traffic. Server-wide counters (/metrics, cached_tokens, the radix cache) are compared
before/after within one test, or the cache is flushed first; the pool check holds after
every test whatever ran before it."""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator
from typing import Any

import pytest

from tests.server_harness import assert_pool_free, running_server

# RADIXLM_E2E_SERVER_ARGS: more `radixlm serve` flags for the shared server, e.g.
# "--enable-torch-compile --torch-compile-max-bs 8" to run it on compiled decode graphs
# (RADIXLM_E2E_STARTUP_TIMEOUT_S then gives the compile time).
EXTRA_SERVER_ARGS = shlex.split(os.environ.get("RADIXLM_E2E_SERVER_ARGS", ""))
STARTUP_TIMEOUT_S = float(os.environ.get("RADIXLM_E2E_STARTUP_TIMEOUT_S", "180"))
DEFAULT_SERVER_FLAGS = ("--max-total-tokens", "4096", "--max-running-requests", "8",
                        "--responses-store-size", "4")


@pytest.fixture(scope="session")
def default_server() -> Iterator[str]:
    """`radixlm serve` with the default model and DEFAULT_SERVER_FLAGS (+ the variable's),
    started by the first module that asks, stopped (SIGTERM, no child left) at the end."""
    with running_server(None, *DEFAULT_SERVER_FLAGS, *EXTRA_SERVER_ARGS,
                        startup_s=STARTUP_TIMEOUT_S) as srv:
        yield srv.url


@pytest.fixture(scope="module")
def client(server: str) -> Any:
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server + "/v1", api_key="x", timeout=300, max_retries=0)


@pytest.fixture
def pool_invariant(server: str) -> Iterator[None]:
    """After a test: once the scheduler is idle, every KV slot is free again (a module
    opts in with `pytest.mark.usefixtures("pool_invariant")`)."""
    yield
    assert_pool_free(server)
