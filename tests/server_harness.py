"""A real `radixlm serve` subprocess for tests (tiny random model by default), servers
started side by side (`started_together`: their start-ups overlap), and the pool check
every test runs once the server is idle."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from typing import TypeVar

import httpx

from tests.process_tree import descendants, free_port, terminate_tree, wait_healthy


@dataclass
class RunningServer:
    url: str
    proc: subprocess.Popen
    log_path: str

    def log_tail(self, n: int = 4000) -> str:
        with open(self.log_path) as f:
            return f.read()[-n:]

    def children(self) -> set[int]:
        return descendants(self.proc.pid)


@contextmanager
def running_server(model: str | None, *flags: str, startup_s: float = 180,
                   new_session: bool = False) -> Iterator[RunningServer]:
    """Start `radixlm serve --model MODEL FLAGS...` (model None: the default model) on a
    free port, wait until healthy, stop it afterwards (SIGTERM) and check that none of its
    processes outlives it. `new_session`: the server leads its own process group (a test
    may signal the group)."""
    port = free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="radixlm-test-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "radixlm", "serve", *(["--model", model] if model else []),
           "--port", str(port), *flags]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=new_session)
    server = RunningServer(f"http://127.0.0.1:{port}", proc, log.name)
    started: set[int] = set()
    try:
        wait_healthy(proc, server.url, startup_s, server.log_tail)
        started = server.children()
        try:
            yield server
        except BaseException:
            print(f"--- server log tail ---\n{server.log_tail(20000)}")  # shown by pytest
            raise
    finally:
        if proc.poll() is None:
            started |= server.children()
        obeyed, orphans = terminate_tree(proc, started)
        tail = server.log_tail()
        log.close()
        os.unlink(log.name)
        assert obeyed, f"server ignored SIGTERM:\n{tail}"
        assert not orphans, f"child processes left after SIGTERM: {orphans}\n{tail}"


T = TypeVar("T")


@contextmanager
def started_together(*servers: AbstractContextManager[T]) -> Iterator[list[T]]:
    """Enter every context manager at once, each in its own thread (a server's start-up is
    mostly waiting on its children's imports and model load, so two overlap), yield what
    they entered as, in order; exit them all in reverse order afterwards. If any fails to
    start, the ones that started are stopped and the first error is raised."""
    with ExitStack() as stack:
        with ThreadPoolExecutor(len(servers)) as pool:
            futures = [pool.submit(cm.__enter__) for cm in servers]
        entered: list[T] = []
        error: BaseException | None = None
        for cm, fut in zip(servers, futures):
            try:
                entered.append(fut.result())
            except BaseException as exc:  # noqa: BLE001 -- re-raised below
                error = error or exc
                continue
            stack.push(cm)
        if error is not None:
            raise error
        yield entered


def idle_pool(url: str, timeout_s: float = 30.0) -> dict:
    """The scheduler's pool once nothing runs or waits (aborted requests are freed at its
    next step)."""
    deadline = time.monotonic() + timeout_s
    while True:
        pool = httpx.get(url + "/server_info", timeout=30).json()["pool"]
        if pool["running"] == 0 and pool["waiting"] == 0 or time.monotonic() > deadline:
            return pool
        time.sleep(0.1)


def assert_pool_free(url: str) -> dict:
    """Every KV slot is free or held by the radix cache; no request holds any."""
    pool = idle_pool(url)
    assert pool["invariant_error"] is None, pool
    assert pool["running"] == 0 and pool["waiting"] == 0, pool
    assert pool["held_by_requests"] == 0, pool
    assert pool["free_kv_slots"] + pool["held_by_cache"] == pool["total_kv_slots"], pool
    return pool
