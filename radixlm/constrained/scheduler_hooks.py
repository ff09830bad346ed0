"""ConstrainedDecoding: the scheduler's one handle on structured output.

More: docs/scheduler.md, "constrained/scheduler_hooks.py".
"""

from __future__ import annotations

import logging
import time
from typing import Any

from radixlm.constrained.backend import GrammarBackend
from radixlm.constrained.grammar_queue import GrammarQueue, Outcome, no_token_error
from radixlm.constrained.stats import GrammarStats
from radixlm.constrained.step_mask import GrammarStep

logger = logging.getLogger(__name__)

# HTTP status of a request refused because of its constraint.
CONSTRAINT_ERROR_STATUS = 400


class ConstrainedDecoding:
    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int],
                 compile_timeout_s: float = 30.0, cache_size: int = 512,
                 compile_threads: int = 1, synchronous: bool = False,
                 backend: GrammarBackend | None = None) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._stop_ids = list(stop_token_ids)
        self._timeout = compile_timeout_s
        self._cache_size = cache_size
        self._threads = compile_threads
        self._synchronous = synchronous
        self._given_backend = backend
        self.queue: GrammarQueue | None = None  # built on the first constrained request
        # Overlap + jump-forward: masks keep generator states (step_mask.py).
        self.snapshot_generators = False

    # --- state -------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        """A constrained request has arrived since start (the counters are live)."""
        return self.queue is not None

    @property
    def num_queued(self) -> int:
        return len(self.queue.pending) if self.queue is not None else 0

    @property
    def stats(self) -> GrammarStats | None:
        if self.queue is None:
            return None
        s = self.queue.stats
        s.cache_hits, s.cache_misses = self.queue.cache.hits, self.queue.cache.misses
        return s

    def _make_backend(self) -> GrammarBackend:
        if self._given_backend is not None:
            return self._given_backend
        from radixlm.constrained.xgrammar_backend import XGrammarBackend

        t0 = time.perf_counter()
        backend = XGrammarBackend.from_tokenizer(self._tokenizer, self._vocab_size, self._stop_ids)
        logger.info("grammar backend xgrammar ready in %.2f s (vocab %d)",
                    time.perf_counter() - t0, self._vocab_size)
        return backend

    # --- the five hooks ----------------------------------------------------------------

    def add(self, req: Any) -> None:
        if self.queue is None:
            self.queue = GrammarQueue(self._make_backend, self._timeout, self._cache_size,
                                      self._threads, self._synchronous)
        self.queue.submit(req, req.sampling_params.constraint)

    def ready(self) -> list[Outcome]:
        return self.queue.ready() if self.queue is not None else []

    def wait(self, timeout: float) -> None:
        if self.queue is not None:
            self.queue.wait_any(timeout)

    def step_for(self, reqs: list[Any]) -> GrammarStep | None:
        if self.queue is None:
            return None
        rows = [i for i, r in enumerate(reqs) if r.grammar is not None]
        stats = self.queue.stats
        stats.sampled_rows += len(reqs)
        if not rows:
            return None
        stats.constrained_rows += len(rows)
        return GrammarStep(self.queue.backend, reqs, rows, stats, self.snapshot_generators)

    @staticmethod
    def accept(req: Any, token: int) -> None:
        """Advance `req`'s matcher by its newly appended token (caller: the request has
        a matcher and is not finished)."""
        m = req.grammar
        if not m.accept(token):
            # A masked sample is always allowed, unless the mask allowed nothing (a
            # grammar this tokenizer cannot complete): the request's fault, a 400.
            if m.allows_no_token():
                c = req.sampling_params.constraint
                generated = max(0, len(req.output_ids) - 1)  # the rejected one is appended
                req.finish("abort", error=no_token_error(c.field or c.kind, generated),
                           error_status=CONSTRAINT_ERROR_STATUS)
                return
            logger.error("request %s: token %d rejected by its grammar", req.rid, token)
            req.finish("abort", error=f"internal error: sampled token {token} violates the "
                                      "request's grammar")
        elif m.is_terminated():
            req.finish("stop", matched=token if token in req.eos_token_ids else None)

    def abort(self, rid: str) -> Any | None:
        return self.queue.abort(rid) if self.queue is not None else None

    def shutdown(self) -> None:
        if self.queue is not None:
            self.queue.shutdown()
