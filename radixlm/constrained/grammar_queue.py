"""GrammarQueue: compiles constraints off the scheduler's critical path.

A constrained request does not enter the waiting queue at once: it waits here while a
compile thread builds its grammar (or the cache has it), and the scheduler keeps running
the other requests. Each step `ready()` hands back the requests whose grammar is done --
with a fresh matcher on `req.grammar` -- and those that failed or passed
`--grammar-compile-timeout` (their error is a 400). A compilation that times out keeps
running on its thread; its result is cached, so a retry is a hit.

The backend itself (xgrammar import + tokenizer info, seconds) is built lazily on the
first compile thread, never on the scheduler thread. Matchers are created and used on the
scheduler thread only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any

from radixlm.constrained.backend import GrammarBackend
from radixlm.constrained.constraint import Constraint
from radixlm.constrained.grammar_cache import CacheEntry, GrammarCache
from radixlm.constrained.stats import GrammarStats

logger = logging.getLogger(__name__)


def no_token_error(field: str, generated: int) -> str:
    """The 400 for a grammar that allows no token of the model's vocabulary."""
    return (f"invalid {field}: after {generated} generated tokens the grammar allows no "
            "token of this model's vocabulary (the tokenizer cannot produce the text it "
            "requires)")


@dataclass(slots=True)
class Pending:
    req: Any  # radixlm.scheduler.req.Req
    future: Future
    t_submit: float


@dataclass(slots=True)
class Outcome:
    req: Any
    error: str | None  # None: req.grammar holds its matcher


class GrammarQueue:
    def __init__(self, make_backend: Callable[[], GrammarBackend], timeout_s: float,
                 cache_size: int = 512, threads: int = 1, synchronous: bool = False) -> None:
        if timeout_s <= 0:
            raise ValueError(f"--grammar-compile-timeout must be > 0, got {timeout_s}")
        self._make_backend = make_backend
        self._backend: GrammarBackend | None = None
        self._backend_lock = threading.Lock()
        self.timeout_s = timeout_s
        self.cache = GrammarCache(cache_size)
        self.stats = GrammarStats()
        # Tensor parallelism: every rank must admit the request in the same step, so the
        # caller waits for the compilation (bounded by the timeout) instead of polling.
        self.synchronous = synchronous
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="grammar")
        self.pending: list[Pending] = []

    @property
    def backend(self) -> GrammarBackend:
        with self._backend_lock:
            if self._backend is None:
                self._backend = self._make_backend()
            return self._backend

    def submit(self, req: Any, constraint: Constraint, now: float | None = None) -> None:
        """Queue `req` until its grammar is compiled."""
        now = time.perf_counter() if now is None else now
        self.pending.append(Pending(req, self._pool.submit(self._compile, constraint), now))
        if self.synchronous:
            wait_futures([self.pending[-1].future], timeout=self.timeout_s)

    def _compile(self, constraint: Constraint) -> CacheEntry:
        """Compile thread: the cache entry of `constraint` (compiling it on a miss)."""
        backend = self.backend
        entry = self.cache.get(constraint.key)
        if entry is not None:
            self.stats.cache_hits += 1
            return entry
        self.stats.cache_misses += 1
        t0 = time.perf_counter()
        try:
            entry = CacheEntry(compiled=backend.compile(constraint))
        except Exception as e:  # an invalid spec: cached as such
            entry = CacheEntry(error=f"invalid {constraint.field or constraint.kind}: "
                                     f"{_first_line(e)}")
            self.stats.compile_failures += 1
        dt = time.perf_counter() - t0
        self.stats.compiles += 1
        self.stats.compile_s += dt
        self.stats.compile_s_max = max(self.stats.compile_s_max, dt)
        self.cache.put(constraint.key, entry)
        return entry

    def abort(self, rid: str) -> Any | None:
        """Drop a queued request; returns it (None if not queued here)."""
        for i, p in enumerate(self.pending):
            if p.req.rid == rid:
                del self.pending[i]
                return p.req
        return None

    def ready(self, now: float | None = None) -> list[Outcome]:
        """Requests leaving the queue: compiled (matcher attached), failed or timed out."""
        if not self.pending:
            return []
        now = time.perf_counter() if now is None else now
        out: list[Outcome] = []
        still: list[Pending] = []
        for p in self.pending:
            if p.future.done():
                out.append(self._finish(p, now))
            elif now - p.t_submit > self.timeout_s:
                self.stats.compile_timeouts += 1
                out.append(Outcome(p.req, (
                    f"grammar compilation took longer than --grammar-compile-timeout "
                    f"({self.timeout_s:g} s); simplify the schema or grammar")))
                self._record_wait(p, now)
            else:
                still.append(p)
        self.pending = still
        return out

    def _finish(self, p: Pending, now: float) -> Outcome:
        self._record_wait(p, now)
        try:
            entry: CacheEntry = p.future.result()
        except Exception as e:  # the backend failed to build (e.g. tokenizer unsupported)
            logger.exception("grammar backend failed")
            return Outcome(p.req, f"constrained decoding is unavailable: {_first_line(e)}")
        if entry.error is not None:
            return Outcome(p.req, entry.error)
        matcher = self.backend.matcher(entry.compiled)
        if matcher.allows_no_token():
            c = p.req.sampling_params.constraint
            return Outcome(p.req, no_token_error(c.field or c.kind, generated=0))
        p.req.grammar = matcher
        return Outcome(p.req, None)

    def _record_wait(self, p: Pending, now: float) -> None:
        self.stats.queue_wait_s += max(0.0, now - p.t_submit)
        self.stats.queued_requests += 1

    def wait_any(self, timeout: float) -> None:
        """Block until a queued compilation finishes or `timeout` passes (the scheduler
        calls this when nothing else is runnable, instead of spinning)."""
        if self.pending:
            left = min(p.t_submit + self.timeout_s for p in self.pending) - time.perf_counter()
            wait_futures([p.future for p in self.pending], timeout=max(0.0, min(timeout, left)),
                         return_when="FIRST_COMPLETED")

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _first_line(e: Exception) -> str:
    msg = str(e).strip()
    if msg.startswith("[") and ": " in msg:  # xgrammar: "[time] /path/file.cc:line: msg"
        msg = msg.split(": ", 1)[1]
    return msg.splitlines()[0] if msg else type(e).__name__
