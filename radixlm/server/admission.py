"""Admission control of the API process: backpressure, the drain on shutdown, and
requests that could never be admitted.

Every generate request is checked here before the first byte of its response, with the
number of choices it will send to the scheduler (prompts x n):

  * draining (SIGTERM received, `server/drain.py`): 503, nothing new is admitted;
  * more choices than running + queued requests can ever hold: 400 (retrying cannot help);
  * in flight + its choices > running limit + `--max-queued-requests`: 429 with
    `Retry-After` (the queue is full; another instance, or later, may take it).

`admit` checks and counts in one step (no await between them, so a flood of requests
that all arrive before any has been sent cannot overshoot): `in_flight` holds the choices
of every admitted request until its handler releases them (its answer sent, or failed).
The queue depth is in flight minus the running limit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel

from radixlm.server.errors import APIError
from radixlm.server.metrics import MetricDef

# --max-queued-requests when not given: this many times the running limit may wait.
DEFAULT_QUEUE_FACTOR = 4
RETRY_AFTER_S = 1


class QueueFull(APIError):
    """429: the waiting queue is full. Carries the Retry-After seconds."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(429, message)
        self.retry_after_s = retry_after_s


@dataclass
class AdmissionControl:
    max_running: int
    max_queued: int
    draining: bool = False
    in_flight: int = 0  # choices admitted and not yet released
    rejected_queue_full: int = 0
    rejected_draining: int = 0
    rejected_too_large: int = 0

    @classmethod
    def from_limits(cls, max_running: int | None, max_queued: int | None) -> "AdmissionControl":
        running = max(1, max_running or 1)
        queued = DEFAULT_QUEUE_FACTOR * running if max_queued is None else max(0, max_queued)
        return cls(running, queued)

    @property
    def capacity(self) -> int:
        return self.max_running + self.max_queued

    def admit(self, choices: int) -> int:
        """Check and count in one step: raise APIError (503 / 400 / 429) unless `choices`
        more requests may be sent, else add them to `in_flight` and return `choices` (the
        caller hands that number back to `release` once its answer is sent)."""
        self.check(choices, self.in_flight)
        self.in_flight += choices
        return choices

    def release(self, choices: int) -> None:
        self.in_flight = max(0, self.in_flight - choices)

    def check(self, choices: int, in_flight: int) -> None:
        """Raise APIError (503 / 400 / 429) unless `choices` more requests may be sent."""
        if self.draining:
            self.rejected_draining += 1
            raise APIError(503, "The server is shutting down and accepts no new requests; "
                           "retry on another instance.")
        if choices > self.capacity:
            self.rejected_too_large += 1
            raise APIError(400, f"This request has {choices} choices (prompts x n) but this "
                           f"server holds at most {self.capacity} requests ("
                           f"{self.max_running} running + {self.max_queued} queued); send "
                           "fewer prompts or a smaller n.", param="n")
        if in_flight + choices > self.capacity:
            self.rejected_queue_full += 1
            raise QueueFull(f"The server is overloaded: {in_flight} requests in flight, at "
                            f"most {self.max_running} running + {self.max_queued} queued. "
                            f"Retry after {RETRY_AFTER_S} s.", RETRY_AFTER_S)

    def metric_defs(self, in_flight: Callable[[], int]) -> list[MetricDef]:
        return [
            MetricDef("radixlm_api_queued_requests", "Requests sent to the scheduler beyond the "
                      "running limit (in flight - max running), as the API process counts "
                      "them.", "gauge",
                      lambda s: float(max(0, in_flight() - self.max_running))),
            MetricDef("radixlm_api_requests_in_flight", "Requests sent to the scheduler and "
                      "not yet answered.", "gauge", lambda s: float(in_flight())),
            MetricDef("radixlm_max_queued_requests", "--max-queued-requests (the limit beyond "
                      "the running one).", "gauge", lambda s: float(self.max_queued)),
            MetricDef("radixlm_rejected_queue_full", "Requests answered 429: the queue was "
                      "full.", "counter", lambda s: float(self.rejected_queue_full)),
            MetricDef("radixlm_rejected_draining", "Requests answered 503 while draining.",
                      "counter", lambda s: float(self.rejected_draining)),
            MetricDef("radixlm_rejected_too_large", "Requests answered 400: more choices than "
                      "the server can ever hold.", "counter",
                      lambda s: float(self.rejected_too_large)),
            MetricDef("radixlm_draining", "1 while the server drains before shutting down.",
                      "gauge", lambda s: float(self.draining)),
        ]


def choice_count(req: BaseModel) -> int:
    """How many requests `req` sends to the scheduler: prompts x n (native: prompts)."""
    prompts = getattr(req, "prompts", None)
    n_prompts = len(prompts()) if callable(prompts) else 1
    return n_prompts * (getattr(req, "num_choices", None) or 1)
