"""GrammarStep: the token bitmask of one launched batch's constrained rows.

Timeline of one batch (`scheduler.py` builds it in `_launch`):
  * serial loop: `fill()` on the scheduler thread right before the launch (the matchers
    have accepted every earlier token);
  * overlap loop: the batch is launched first; the scheduler then processes the previous
    batch (its tokens are accepted by the matchers) and calls `fill()` while this
    batch's forward runs on the forward thread;
  * forward thread: `apply(logits)` waits for the fill, then masks the rows in place,
    just before sampling. The sampled token is accepted by the request's matcher when
    the scheduler processes the batch (`OutputProcessor`).
A row whose request has already finished (overlap: its last token came in the previous
batch) or whose grammar terminated allows every token: that sample is dropped anyway.
`fill()` always sets the event, even when a matcher raises, so the forward never hangs.
`snapshot_generators` (overlap + jump-forward): `apply` keeps rows' pre-draw generator state.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from radixlm.constrained.backend import GrammarBackend
from radixlm.constrained.stats import GrammarStats


class GrammarStep:
    __slots__ = ("backend", "reqs", "rows", "bitmask", "_ready", "error", "stats",
                 "snapshot_generators", "_gen_states")

    def __init__(self, backend: GrammarBackend, reqs: list[Any], rows: list[int],
                 stats: GrammarStats, snapshot_generators: bool = False) -> None:
        """`reqs`: the batch's sampling requests in logits order; `rows`: the indices of
        those with a matcher (`req.grammar`)."""
        self.backend = backend
        self.reqs = reqs
        self.rows = rows
        self.bitmask = backend.allocate_bitmask(len(reqs))
        self._ready = threading.Event()
        self.error: BaseException | None = None
        self.stats = stats
        self.snapshot_generators = snapshot_generators
        self._gen_states: dict[int, torch.Tensor] = {}

    @property
    def filled(self) -> bool:
        return self._ready.is_set()

    def fill(self) -> None:
        """Scheduler thread. Idempotent."""
        if self._ready.is_set():
            return
        t0 = time.perf_counter()
        try:
            for i in self.rows:
                req = self.reqs[i]
                m = req.grammar
                if req.finished or m is None or m.is_terminated():
                    self.backend.allow_all(self.bitmask, i)
                else:
                    m.fill_bitmask(self.bitmask, i)
        except BaseException as e:  # surfaced by apply() on the forward thread
            self.error = e
            raise
        finally:
            self.stats.mask_s += time.perf_counter() - t0
            self.stats.mask_steps += 1
            self._ready.set()

    def apply(self, logits: torch.Tensor) -> None:
        """Forward thread: mask `logits` ([len(reqs), vocab]) in place."""
        self._ready.wait()
        if self.error is not None:
            raise RuntimeError(f"grammar bitmask fill failed: {self.error!r}")
        if self.snapshot_generators:
            for i in self.rows:
                g = self.reqs[i].generator
                if g is not None:
                    self._gen_states[i] = g.get_state()
        self.backend.apply_bitmask(logits, self.bitmask, self.rows)

    def generator_state(self, row: int) -> torch.Tensor | None:
        """Row `row`'s generator state before this batch's draw (after the batch ran)."""
        return self._gen_states.get(row)
