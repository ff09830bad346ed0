"""The router's view of its workers: URL, health, and load (requests in flight).

`WorkerRegistry` is plain state with no I/O: the proxy, the health checker and the
`/workers` routes mutate it, the policies read it. Load is counted by `LoadGuard`, a
context manager held for exactly as long as a request occupies a worker, so the counter
is released on every path (success, error, retry, client disconnect = cancellation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType


def normalize_url(url: str) -> str:
    """'127.0.0.1:8000/' -> 'http://127.0.0.1:8000': one spelling per worker."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url


@dataclass(eq=False)  # identity: a re-added URL is a new Worker
class Worker:
    url: str
    healthy: bool = True
    load: int = 0  # requests in flight through this router
    consecutive_failures: int = 0  # failed health checks in a row
    consecutive_successes: int = 0  # passed health checks in a row while unhealthy


class WorkerRegistry:
    """Workers in the order they were added. `on_unavailable(url)` callbacks run after a
    worker is removed or turns unhealthy (the policy drops its state for it)."""

    def __init__(self, urls: list[str] | None = None) -> None:
        self._workers: dict[str, Worker] = {}
        self.on_unavailable: list[Callable[[str], None]] = []
        for url in urls or []:
            self.add(url)

    def add(self, url: str) -> Worker:
        """Add a worker (healthy until a check says otherwise); a known URL is kept as is."""
        url = normalize_url(url)
        if url not in self._workers:
            self._workers[url] = Worker(url)
        return self._workers[url]

    def remove(self, url: str) -> bool:
        """Forget a worker. Requests in flight to it finish and release their own count."""
        worker = self._workers.pop(normalize_url(url), None)
        if worker is None:
            return False
        for cb in self.on_unavailable:
            cb(worker.url)
        return True

    def get(self, url: str) -> Worker | None:
        return self._workers.get(normalize_url(url))

    def all(self) -> list[Worker]:
        return list(self._workers.values())

    def healthy(self) -> list[Worker]:
        return [w for w in self._workers.values() if w.healthy]

    def set_healthy(self, url: str, healthy: bool) -> bool:
        """Mark a worker up or down; returns True when its state changed."""
        worker = self.get(url)
        if worker is None or worker.healthy == healthy:
            return False
        worker.healthy = healthy
        worker.consecutive_failures = worker.consecutive_successes = 0
        if not healthy:
            for cb in self.on_unavailable:
                cb(worker.url)
        return True

    def guard(self, worker: Worker) -> "LoadGuard":
        return LoadGuard(self, worker)

    @staticmethod
    def _change_load(worker: Worker, delta: int) -> None:
        # The guard holds the Worker object itself: a worker removed and re-added under
        # the same URL while this request ran is a new object whose count stays right.
        worker.load += delta
        assert worker.load >= 0, worker


class LoadGuard:
    """`with registry.guard(worker):` counts one request in flight on `worker`. Usable as a
    sync or async context manager; `release()` is idempotent, so a streaming response can
    release early from its own `finally` and the guard's exit does nothing more."""

    def __init__(self, registry: WorkerRegistry, worker: Worker) -> None:
        self._registry = registry
        self.worker = worker
        self._held = False

    def acquire(self) -> "LoadGuard":
        if not self._held:
            self._held = True
            self._registry._change_load(self.worker, +1)
        return self

    def release(self) -> None:
        if self._held:
            self._held = False
            self._registry._change_load(self.worker, -1)

    def __enter__(self) -> "LoadGuard":
        return self.acquire()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()

    async def __aenter__(self) -> "LoadGuard":
        return self.acquire()

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.release()
