"""Fixtures shared by the e2e modules that start one server per module (`server`, the
URL): the official `openai` client on it, and the pool check after every test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.server_harness import assert_pool_free


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
