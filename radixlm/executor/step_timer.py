"""StepTimer: the device timeline of a busy scheduler -- forward time and the bubble.

The *bubble* is the device sitting idle between two forwards while the scheduler had work
all along: the device waiting for the CPU. It is measured on one of two clocks:

  * host clock (the CPU, where the forward thread's time is the device's time): the
    worker calls `forward_started` / `forward_ended` around each task;
  * device clock (CUDA, where the forward thread only enqueues kernels): the worker
    records a timing event on the forward stream at the start and at the end of each
    task, and once the task's results are read (its events are complete then) hands the
    pair to `device_task_done`, which takes forward time and the gap since the previous
    task's end from `Event.elapsed_time` (milliseconds).

More: docs/executor.md, "executor/step_timer.py".
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Protocol


class TimingEvent(Protocol):
    """What `device_task_done` needs of a (complete) torch.cuda.Event(enable_timing=True)."""

    def elapsed_time(self, end_event: "TimingEvent") -> float: ...  # milliseconds


@dataclass
class StepTimer:
    """Cumulative timing of a busy scheduler (seconds). Idle periods (no work at all) are
    not counted."""
    forwards: int = 0
    forward_s: float = 0.0  # device busy: forward + sampling of every batch
    # The same for decode batches alone (one token per request): a decode step's time,
    # to set beside the inter-token latency a client sees.
    decode_forwards: int = 0
    decode_forward_s: float = 0.0
    bubble_s: float = 0.0  # device idle between two forwards while work was pending
    schedule_s: float = 0.0  # scheduler thread CPU work per step (not waiting on results)
    oom_splits: int = 0  # forwards re-run in halves after running out of memory
    oom_failures: int = 0  # requests failed: their forward ran out of memory even alone
    last_end: float | None = None  # host clock: when the last forward ended
    # Device clock: the end event of the last task read, and whether mark_idle was called
    # since the last launch (True before the first one: nothing precedes it).
    last_end_event: TimingEvent | None = None
    idle_since_launch: bool = True
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # --- host clock (forward thread) ----------------------------------------------------

    def forward_started(self) -> float:
        now = time.perf_counter()
        with self.lock:
            if self.last_end is not None:
                self.bubble_s += now - self.last_end
        return now

    def forward_ended(self, started: float, decode: bool = False) -> None:
        now = time.perf_counter()
        with self.lock:
            self._count(now - started, decode)
            self.last_end = now

    def _count(self, seconds: float, decode: bool) -> None:
        self.forwards += 1
        self.forward_s += seconds
        if decode:
            self.decode_forwards += 1
            self.decode_forward_s += seconds

    # --- device clock (scheduler thread) ------------------------------------------------

    def launched(self) -> bool:
        """At a launch: True when the device gap before this task counts as bubble, i.e.
        `mark_idle` was not called since the previous launch."""
        with self.lock:
            counts = not self.idle_since_launch
            self.idle_since_launch = False
            return counts

    def device_task_done(self, started: TimingEvent, ended: TimingEvent,
                         gap_counts: bool, decode: bool = False) -> None:
        """A task's start and end events, both complete. Tasks must be reported in launch
        order (the scheduler reads results in that order), so `last_end_event` is the
        previous task's end."""
        with self.lock:
            self._count(started.elapsed_time(ended) / 1000.0, decode)
            if gap_counts and self.last_end_event is not None:
                # Clamped: two events of one stream are ordered, a rounding is not.
                self.bubble_s += max(0.0, self.last_end_event.elapsed_time(started) / 1000.0)
            self.last_end_event = ended

    # --- both ------------------------------------------------------------------------------

    def mark_idle(self) -> None:
        with self.lock:
            self.last_end = None
            self.idle_since_launch = True

    @property
    def bubble_share(self) -> float:
        """Bubble / (forward + bubble): the share of the busy device timeline lost waiting."""
        busy = self.forward_s + self.bubble_s
        return self.bubble_s / busy if busy > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        return {"forwards": self.forwards, "forward_s": self.forward_s,
                "decode_forwards": self.decode_forwards,
                "decode_forward_s": self.decode_forward_s,
                "bubble_s": self.bubble_s, "schedule_s": self.schedule_s,
                "bubble_share": self.bubble_share, "oom_splits": self.oom_splits,
                "oom_failures": self.oom_failures}
